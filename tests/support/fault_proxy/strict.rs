//! Strict SQS: the rules of real SQS that moto does not keep, enforced on the wire.
//!
//! moto expires nothing, honours every receipt handle a message ever had, checks no
//! characters, counts bodies only, has no in-flight cap and deduplicates FIFO sends only
//! against messages still queued. A proxy in strict mode ([`super::FaultProxy::start_strict`])
//! holds each SQS call to SQS's rule instead:
//!
//! * Retention: a received message older than its queue's `MessageRetentionPeriod` (from its
//!   `SentTimestamp`, which receives are made to ask for and which is stripped again when the
//!   caller did not ask) is dropped from the answer and deleted upstream. A delete or
//!   visibility change of a held message past its retention finds no message, as in SQS.
//! * Receipt handles: only a message's latest handle acts. A delete with an older one (or of a
//!   message already deleted) succeeds and deletes nothing; a visibility change with one is
//!   refused `InvalidParameterValue` ("Message does not exist or is not available for
//!   visibility timeout change"), per entry in a batch.
//! * Sends: bodies and String/Number attribute values within SQS's characters
//!   (`#x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD | #x10000-#x10FFFF`, else
//!   `InvalidMessageContents`); at most 10 message attributes; names of up to 256 characters
//!   of `[A-Za-z0-9_.-]`, no leading, trailing or doubled period, no `AWS.`/`Amazon.` prefix;
//!   data types `String`, `Number`, `Binary` with an optional `.custom` suffix; body plus every
//!   attribute's name, type and value within the queue's `MaximumMessageSize`. A batch refuses
//!   the offending entries only.
//! * In-flight cap: at most [`DEFAULT_IN_FLIGHT_CAP`] (or the queue's own cap, see
//!   [`super::FaultProxy::set_in_flight_cap`]) messages received and not yet deleted or
//!   visible again. At the cap a long poll waits and returns nothing; a short poll is answered
//!   `OverLimit`. A receive below the cap hands out no more than the room left.
//! * Partial receives: SQS may hand out fewer messages than asked for and than the queue
//!   holds (a short poll samples some of its servers; a long poll returns once any arrive).
//!   Every other receive asking for more than one message of a queue (the first, third, ...)
//!   is handed at most half of them, rounded up, so a caller that takes one receive for the
//!   whole queue is caught. [`super::FaultProxy::receive_whole`] turns this off for a queue
//!   whose test needs a whole receive as its premise (and asserts it).
//! * FIFO deduplication: a send whose deduplication id (or body hash, for content-based
//!   deduplication) was accepted in the last five minutes is answered with the first send's
//!   message id and sequence number and not forwarded, whether or not the first was deleted.
//!
//! What the proxy knows of a queue (retention, visibility, FIFO, size) it asks moto with a
//! `GetQueueAttributes`, again after a `SetQueueAttributes` or `CreateQueue`. Only what passes
//! through the proxy is tracked: a client that talks to moto directly escapes the rules.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::{Value, json};

use super::{Ctx, forward, lock};

/// In-flight messages per queue a strict proxy allows unless told otherwise: small, so tests
/// can meet it; SQS's own is about 120,000 (standard and FIFO alike).
pub const DEFAULT_IN_FLIGHT_CAP: u64 = 200;

/// SQS's FIFO deduplication interval.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(300);

/// The refusal of a visibility change with a handle that is not the message's latest.
const STALE_HANDLE_REASON: &str = "Message does not exist or is not available for visibility timeout change.";

#[derive(Clone, Copy, Debug)]
struct QueueAttrs {
    retention_ms: u64,
    visibility_s: u64,
    wait_s: u64,
    fifo: bool,
    content_dedup: bool,
    dedup_per_group: bool,
    max_size: usize,
}

#[derive(Debug)]
struct Tracked {
    latest: String,
    sent_ms: Option<u64>,
    in_flight_until: Option<Instant>,
    deleted: bool,
}

#[derive(Default, Debug)]
struct QueueState {
    attrs: Option<QueueAttrs>,
    /// The retention the caller set; moto is given SQS's longest, so that only this proxy
    /// expires messages (moto hides an expired message but keeps it, and redrives it).
    retention_s: Option<u64>,
    /// How much older than their `SentTimestamp` says the queue's messages are taken to be.
    age_ms: u64,
    cap: Option<u64>,
    /// Receives of more than one message so far, for the partial-receive rule.
    receives: u64,
    /// The partial-receive rule is off for this queue.
    whole: bool,
    messages: HashMap<String, Tracked>,
    handles: HashMap<String, String>,
    /// Deduplication key → (first accepted send, its answer entry).
    dedup: HashMap<String, (Instant, Value)>,
}

impl QueueState {
    fn tracked(&mut self, handle: &str) -> Option<&mut Tracked> {
        let id = self.handles.get(handle)?;
        self.messages.get_mut(id)
    }

    fn in_flight(&self, now: Instant) -> u64 {
        self.messages
            .values()
            .filter(|m| !m.deleted && m.in_flight_until.is_some_and(|t| t > now))
            .count() as u64
    }
}

/// What a strict proxy tracks, per queue name.
#[derive(Default, Debug)]
pub(super) struct Strict {
    queues: Mutex<HashMap<String, QueueState>>,
    counts: Mutex<HashMap<&'static str, u64>>,
}

/// What a handle names, for a delete or a visibility change.
enum HandleState {
    /// Not seen in a receive through this proxy: moto decides.
    Unknown,
    /// The message's latest handle, the message alive.
    Latest,
    /// An older handle, or a message deleted or past its retention.
    Stale,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The queue's name from its URL (`…/<account>/<name>`): the key every rule is kept under,
/// whatever host the caller reached moto through.
fn queue_key(url: &str) -> String {
    url.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(url)
        .to_string()
}

impl Strict {
    /// Rule counts by name (`expired`, `stale_delete`, `stale_visibility`, `refused_send`,
    /// `over_limit`, `dedup_dropped`), for tests that check a rule fired.
    pub(super) fn counts(&self) -> HashMap<&'static str, u64> {
        lock(&self.counts).clone()
    }

    fn count(&self, rule: &'static str, n: u64) {
        if n > 0 {
            *lock(&self.counts).entry(rule).or_default() += n;
        }
    }

    pub(super) fn set_cap(&self, queue_url: &str, cap: u64) {
        lock(&self.queues).entry(queue_key(queue_url)).or_default().cap = Some(cap);
    }

    pub(super) fn receive_whole(&self, queue_url: &str) {
        lock(&self.queues).entry(queue_key(queue_url)).or_default().whole = true;
    }

    /// How many messages a receive asking for `asked` is handed at most: half of them,
    /// rounded up, on every other receive of more than one (see the module's comment).
    fn receive_limit(&self, queue: &str, asked: u64) -> u64 {
        let mut queues = lock(&self.queues);
        let q = queues.entry(queue.to_string()).or_default();
        if asked <= 1 || q.whole {
            return asked;
        }
        q.receives += 1;
        if q.receives % 2 == 1 {
            drop(queues);
            self.count("partial_receive", 1);
            asked.div_ceil(2)
        } else {
            asked
        }
    }

    pub(super) fn age(&self, queue_url: &str, by: Duration) {
        lock(&self.queues).entry(queue_key(queue_url)).or_default().age_ms += by.as_millis() as u64;
    }

    fn cap(&self, q: &QueueState) -> u64 {
        q.cap.unwrap_or_else(default_cap)
    }

    fn handle_state(&self, queue: &str, handle: &str) -> HandleState {
        let queues = lock(&self.queues);
        let Some(q) = queues.get(queue) else {
            return HandleState::Unknown;
        };
        let Some(id) = q.handles.get(handle) else {
            return HandleState::Unknown;
        };
        let Some(m) = q.messages.get(id) else {
            return HandleState::Unknown;
        };
        let expired = match (q.attrs, m.sent_ms) {
            (Some(a), Some(sent)) => (now_ms() + q.age_ms).saturating_sub(sent) > a.retention_ms,
            _ => false,
        };
        if m.deleted || expired || m.latest != handle {
            HandleState::Stale
        } else {
            HandleState::Latest
        }
    }

    fn mark_deleted(&self, queue: &str, handle: &str) {
        if let Some(m) = lock(&self.queues).get_mut(queue).and_then(|q| q.tracked(handle)) {
            m.deleted = true;
            m.in_flight_until = None;
        }
    }

    fn set_visibility(&self, queue: &str, handle: &str, seconds: u64) {
        let mut queues = lock(&self.queues);
        let Some(m) = queues.get_mut(queue).and_then(|q| q.tracked(handle)) else {
            return;
        };
        if m.latest == handle {
            m.in_flight_until = (seconds > 0).then(|| Instant::now() + Duration::from_secs(seconds));
        }
    }
}

fn default_cap() -> u64 {
    std::env::var("SQS_TRIAGE_TEST_IN_FLIGHT_CAP")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_IN_FLIGHT_CAP)
}

// ---------------------------------------------------------------- wire helpers

fn json_response(status: u16, body: &Value, request_id: &str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::OK))
        .header(header::CONTENT_TYPE, "application/x-amz-json-1.0")
        .header("x-amzn-requestid", request_id)
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("strict response")
}

/// An SQS error as SQS's JSON protocol writes it: `__type`, `message` and the query-compatible
/// header the SDK takes the code from.
fn sqs_error(status: u16, code: &str, message: &str, request_id: &str) -> Response<Full<Bytes>> {
    let body = json!({ "__type": format!("com.amazonaws.sqs#{code}"), "message": message });
    let mut resp = json_response(status, &body, request_id);
    if let Ok(v) = HeaderValue::from_str(&format!("{code};Sender")) {
        resp.headers_mut()
            .insert(HeaderName::from_static("x-amzn-query-error"), v);
    }
    resp
}

fn stale_visibility_message(handle: &str) -> String {
    format!("Value {handle} for parameter ReceiptHandle is invalid. Reason: {STALE_HANDLE_REASON}")
}

/// Sends `body` upstream as operation `op`, with the caller's headers (credentials, host).
async fn call(
    ctx: &Ctx,
    parts: &hyper::http::request::Parts,
    op: &str,
    body: &Value,
) -> Option<(u16, Value)> {
    let mut p = parts.clone();
    p.headers.remove(header::CONTENT_LENGTH);
    if let Ok(v) = HeaderValue::from_str(&format!("AmazonSQS.{op}")) {
        p.headers.insert(HeaderName::from_static("x-amz-target"), v);
    }
    let resp = forward(ctx, p, Bytes::from(body.to_string())).await;
    let status = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .ok()?
        .to_bytes();
    Some((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}

async fn forward_json(ctx: &Ctx, parts: &hyper::http::request::Parts, body: &Value) -> Response<Full<Bytes>> {
    let mut p = parts.clone();
    p.headers.remove(header::CONTENT_LENGTH);
    forward(ctx, p, Bytes::from(body.to_string())).await
}

async fn split(resp: Response<Full<Bytes>>) -> (hyper::http::response::Parts, Bytes) {
    let (parts, body) = resp.into_parts();
    let bytes = http_body_util::BodyExt::collect(body)
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    (parts, bytes)
}

fn rebuild(mut parts: hyper::http::response::Parts, body: &Value) -> Response<Full<Bytes>> {
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Full::new(Bytes::from(body.to_string())))
}

// ---------------------------------------------------------------- dispatch

/// Handles one SQS call under the strict rules; `None` when the call is forwarded unchanged.
pub(super) async fn handle(
    ctx: &Ctx,
    parts: &hyper::http::request::Parts,
    op: &str,
    body: &Bytes,
    request_id: &str,
) -> Option<Response<Full<Bytes>>> {
    let strict = ctx.shared.strict.as_ref()?;
    let Ok(Value::Object(req)) = serde_json::from_slice::<Value>(body) else {
        return None;
    };
    let req = Value::Object(req);
    let url = req
        .get("QueueUrl")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let queue = queue_key(&url);
    match op {
        "ReceiveMessage" => Some(receive(ctx, strict, parts, req, &queue, request_id).await),
        "DeleteMessage" => delete_one(ctx, strict, parts, &req, &queue, request_id).await,
        "DeleteMessageBatch" => delete_batch(ctx, strict, parts, req, &queue).await,
        "ChangeMessageVisibility" => visibility_one(ctx, strict, parts, &req, &queue, request_id).await,
        "ChangeMessageVisibilityBatch" => visibility_batch(ctx, strict, parts, req, &queue).await,
        "SendMessage" | "SendMessageBatch" => {
            send(
                ctx,
                strict,
                parts,
                req,
                &queue,
                op == "SendMessageBatch",
                request_id,
            )
            .await
        }
        "GetQueueAttributes" => {
            let retention = lock(&strict.queues).get(&queue).and_then(|q| q.retention_s)?;
            let resp = forward_json(ctx, parts, &req).await;
            if resp.status() != StatusCode::OK {
                return Some(resp);
            }
            let (rparts, bytes) = split(resp).await;
            let Ok(mut answer) = serde_json::from_slice::<Value>(&bytes) else {
                return Some(Response::from_parts(rparts, Full::new(bytes)));
            };
            if let Some(v) = answer.pointer_mut("/Attributes/MessageRetentionPeriod") {
                *v = json!(retention.to_string());
            }
            Some(rebuild(rparts, &answer))
        }
        "SetQueueAttributes" | "PurgeQueue" => {
            let mut req = req;
            let retention = match take_retention(&mut req) {
                Ok(r) => r,
                Err(resp) => return Some(resp(request_id)),
            };
            let resp = forward_json(ctx, parts, &req).await;
            let mut queues = lock(&strict.queues);
            let q = queues.entry(queue).or_default();
            {
                q.attrs = None;
                if resp.status().is_success() && retention.is_some() {
                    q.retention_s = retention;
                }
                if op == "PurgeQueue" && resp.status().is_success() {
                    q.messages.clear();
                    q.handles.clear();
                }
            }
            Some(resp)
        }
        "CreateQueue" | "DeleteQueue" => {
            let name = req
                .get("QueueName")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or(queue);
            let mut req = req;
            let retention = match take_retention(&mut req) {
                Ok(r) => r,
                Err(resp) => return Some(resp(request_id)),
            };
            let resp = forward_json(ctx, parts, &req).await;
            let mut queues = lock(&strict.queues);
            if op == "DeleteQueue" {
                queues.remove(&name);
            } else {
                let q = queues.entry(name).or_default();
                q.attrs = None;
                if resp.status().is_success() && retention.is_some() {
                    q.retention_s = retention;
                }
            }
            Some(resp)
        }
        _ => None,
    }
}

/// SQS's longest retention: what moto is given, so it expires nothing itself.
const MAX_RETENTION_S: u64 = 1_209_600;

type Refusal = Box<dyn FnOnce(&str) -> Response<Full<Bytes>>>;

/// The retention a CreateQueue or SetQueueAttributes asks for, replaced by SQS's longest in
/// the request; a value SQS refuses is refused here too.
fn take_retention(req: &mut Value) -> Result<Option<u64>, Refusal> {
    let Some(v) = req.pointer_mut("/Attributes/MessageRetentionPeriod") else {
        return Ok(None);
    };
    let asked = v.as_str().and_then(|s| s.parse::<u64>().ok());
    match asked {
        Some(s) if (60..=MAX_RETENTION_S).contains(&s) => {
            *v = json!(MAX_RETENTION_S.to_string());
            Ok(Some(s))
        }
        _ => Err(Box::new(|rid: &str| {
            sqs_error(
                400,
                "InvalidAttributeValue",
                "Invalid value for the parameter MessageRetentionPeriod.",
                rid,
            )
        })),
    }
}

/// The queue's attributes, asked of moto once (and after each change).
async fn attrs(
    ctx: &Ctx,
    strict: &Strict,
    parts: &hyper::http::request::Parts,
    url: &str,
) -> Option<QueueAttrs> {
    let queue = queue_key(url);
    if let Some(a) = lock(&strict.queues).get(&queue).and_then(|q| q.attrs) {
        return Some(a);
    }
    let (status, v) = call(
        ctx,
        parts,
        "GetQueueAttributes",
        &json!({ "QueueUrl": url, "AttributeNames": ["All"] }),
    )
    .await?;
    if status != 200 {
        return None;
    }
    let a = v.get("Attributes")?;
    let num = |k: &str, d: u64| {
        a.get(k)
            .and_then(Value::as_str)
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let flag = |k: &str| a.get(k).and_then(Value::as_str) == Some("true");
    let retention_s = lock(&strict.queues).get(&queue).and_then(|q| q.retention_s);
    let attrs = QueueAttrs {
        retention_ms: retention_s.unwrap_or_else(|| num("MessageRetentionPeriod", 345_600)) * 1000,
        visibility_s: num("VisibilityTimeout", 30),
        wait_s: num("ReceiveMessageWaitTimeSeconds", 0),
        fifo: flag("FifoQueue") || queue.ends_with(".fifo"),
        content_dedup: flag("ContentBasedDeduplication"),
        dedup_per_group: a.get("DeduplicationScope").and_then(Value::as_str) == Some("messageGroup"),
        max_size: num("MaximumMessageSize", 262_144) as usize,
    };
    lock(&strict.queues).entry(queue).or_default().attrs = Some(attrs);
    Some(attrs)
}

// ---------------------------------------------------------------- receive

fn asks_for(req: &Value, attr: &str) -> bool {
    ["MessageSystemAttributeNames", "AttributeNames"].iter().any(|k| {
        req.get(*k).and_then(Value::as_array).is_some_and(|names| {
            names
                .iter()
                .any(|n| n.as_str() == Some(attr) || n.as_str() == Some("All"))
        })
    })
}

async fn receive(
    ctx: &Ctx,
    strict: &Strict,
    parts: &hyper::http::request::Parts,
    mut req: Value,
    queue: &str,
    request_id: &str,
) -> Response<Full<Bytes>> {
    let url = req
        .get("QueueUrl")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let Some(a) = attrs(ctx, strict, parts, &url).await else {
        return forward_json(ctx, parts, &req).await;
    };
    let wants_sent = asks_for(&req, "SentTimestamp");
    if !wants_sent {
        let names = req
            .as_object_mut()
            .expect("object")
            .entry("MessageSystemAttributeNames")
            .or_insert_with(|| json!([]));
        if let Some(list) = names.as_array_mut() {
            list.push(json!("SentTimestamp"));
        }
    }
    let wait_s = req
        .get("WaitTimeSeconds")
        .and_then(Value::as_u64)
        .unwrap_or(a.wait_s);
    let visibility_s = req
        .get("VisibilityTimeout")
        .and_then(Value::as_u64)
        .unwrap_or(a.visibility_s);
    let asked = req
        .get("MaxNumberOfMessages")
        .and_then(Value::as_u64)
        .unwrap_or(1);
    let asked = strict.receive_limit(queue, asked);
    let deadline = Instant::now() + Duration::from_secs(wait_s);
    let mut first = true;
    loop {
        let room = {
            let mut queues = lock(&strict.queues);
            let q = queues.entry(queue.to_string()).or_default();
            strict.cap(q).saturating_sub(q.in_flight(Instant::now()))
        };
        if room == 0 {
            if wait_s == 0 {
                strict.count("over_limit", 1);
                return sqs_error(
                    403,
                    "OverLimit",
                    "Too many messages in flight: the queue's in-flight limit is reached.",
                    request_id,
                );
            }
            if Instant::now() >= deadline {
                return json_response(200, &json!({}), request_id);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        req["MaxNumberOfMessages"] = json!(asked.min(room).max(1));
        if wait_s > 0 && !first {
            // What is left of the caller's wait, rounded up: a long poll stays one.
            let left = deadline
                .saturating_duration_since(Instant::now())
                .as_millis()
                .div_ceil(1000);
            req["WaitTimeSeconds"] = json!(left as u64);
        }
        first = false;
        let resp = forward_json(ctx, parts, &req).await;
        if resp.status() != StatusCode::OK {
            return resp;
        }
        let (rparts, bytes) = split(resp).await;
        let Ok(mut answer) = serde_json::from_slice::<Value>(&bytes) else {
            return Response::from_parts(rparts, Full::new(bytes));
        };
        let messages = answer
            .get_mut("Messages")
            .and_then(Value::as_array_mut)
            .map(std::mem::take)
            .unwrap_or_default();
        let age_ms = lock(&strict.queues).get(queue).map_or(0, |q| q.age_ms);
        let now = now_ms() + age_ms;
        let mut kept = Vec::new();
        let mut expired = Vec::new();
        for mut m in messages {
            let sent = m
                .pointer("/Attributes/SentTimestamp")
                .and_then(Value::as_str)
                .and_then(|s| s.parse::<u64>().ok());
            let id = m
                .get("MessageId")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let handle = m
                .get("ReceiptHandle")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            if sent.is_some_and(|s| now.saturating_sub(s) > a.retention_ms) {
                expired.push(handle);
                continue;
            }
            {
                let mut queues = lock(&strict.queues);
                let q = queues.entry(queue.to_string()).or_default();
                q.handles.insert(handle.clone(), id.clone());
                q.messages.insert(
                    id,
                    Tracked {
                        latest: handle,
                        sent_ms: sent,
                        in_flight_until: (visibility_s > 0)
                            .then(|| Instant::now() + Duration::from_secs(visibility_s)),
                        deleted: false,
                    },
                );
            }
            if !wants_sent {
                let emptied = m
                    .get_mut("Attributes")
                    .and_then(Value::as_object_mut)
                    .is_some_and(|attrs| {
                        attrs.remove("SentTimestamp");
                        attrs.is_empty()
                    });
                if emptied {
                    m.as_object_mut().expect("object").remove("Attributes");
                }
            }
            kept.push(m);
        }
        strict.count("expired", expired.len() as u64);
        for chunk in expired.chunks(10) {
            let entries: Vec<Value> = chunk
                .iter()
                .enumerate()
                .map(|(i, h)| json!({ "Id": format!("x{i}"), "ReceiptHandle": h }))
                .collect();
            let _ = call(
                ctx,
                parts,
                "DeleteMessageBatch",
                &json!({ "QueueUrl": url, "Entries": entries }),
            )
            .await;
        }
        let dropped = !expired.is_empty();
        if !kept.is_empty() || !dropped || Instant::now() >= deadline && wait_s > 0 {
            if !kept.is_empty() {
                answer["Messages"] = Value::Array(kept);
            } else if let Some(o) = answer.as_object_mut() {
                o.remove("Messages");
            }
            return rebuild(rparts, &answer);
        }
        // Every message handed out was past its retention: SQS would not have handed them
        // out, so the receive goes on in the time it has left.
    }
}

// ---------------------------------------------------------------- delete, visibility

async fn delete_one(
    ctx: &Ctx,
    strict: &Strict,
    parts: &hyper::http::request::Parts,
    req: &Value,
    queue: &str,
    request_id: &str,
) -> Option<Response<Full<Bytes>>> {
    let handle = req.get("ReceiptHandle").and_then(Value::as_str)?.to_string();
    match strict.handle_state(queue, &handle) {
        HandleState::Unknown => None,
        HandleState::Stale => {
            strict.count("stale_delete", 1);
            Some(json_response(200, &json!({}), request_id))
        }
        HandleState::Latest => {
            let resp = forward_json(ctx, parts, req).await;
            if resp.status().is_success() {
                strict.mark_deleted(queue, &handle);
            }
            Some(resp)
        }
    }
}

/// Splits a batch's entries into those forwarded and those answered here.
fn entries(req: &Value) -> Vec<Value> {
    req.get("Entries")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn entry_handle(e: &Value) -> String {
    e.get("ReceiptHandle")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn entry_id(e: &Value) -> Value {
    e.get("Id").cloned().unwrap_or(Value::Null)
}

/// Forwards `entries` of `req` (when any) and merges `successful` and `failed` entries
/// answered here into the answer.
async fn batch_with(
    ctx: &Ctx,
    parts: &hyper::http::request::Parts,
    mut req: Value,
    forwarded: Vec<Value>,
    successful: Vec<Value>,
    failed: Vec<Value>,
) -> (Response<Full<Bytes>>, Vec<Value>) {
    let (rparts, mut answer) = if forwarded.is_empty() {
        let resp = json_response(200, &json!({}), "strict-sqs");
        let (p, _) = resp.into_parts();
        (p, json!({}))
    } else {
        req["Entries"] = Value::Array(forwarded);
        let resp = forward_json(ctx, parts, &req).await;
        if resp.status() != StatusCode::OK {
            return (resp, Vec::new());
        }
        let (p, bytes) = split(resp).await;
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) => (p, v),
            Err(_) => return (Response::from_parts(p, Full::new(bytes)), Vec::new()),
        }
    };
    let upstream_ok: Vec<Value> = answer
        .get("Successful")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut ok = upstream_ok.clone();
    ok.extend(successful);
    let mut bad: Vec<Value> = answer
        .get("Failed")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    bad.extend(failed);
    answer["Successful"] = Value::Array(ok);
    answer["Failed"] = Value::Array(bad);
    (rebuild(rparts, &answer), upstream_ok)
}

fn ids_of(ok: &[Value]) -> HashSet<String> {
    ok.iter()
        .filter_map(|e| e.get("Id").and_then(Value::as_str).map(str::to_string))
        .collect()
}

async fn delete_batch(
    ctx: &Ctx,
    strict: &Strict,
    parts: &hyper::http::request::Parts,
    req: Value,
    queue: &str,
) -> Option<Response<Full<Bytes>>> {
    let all = entries(&req);
    let (mut forwarded, mut local) = (Vec::new(), Vec::new());
    for e in all {
        match strict.handle_state(queue, &entry_handle(&e)) {
            HandleState::Stale => local.push(json!({ "Id": entry_id(&e) })),
            _ => forwarded.push(e),
        }
    }
    if local.is_empty() {
        let sent = forwarded.clone();
        let (resp, ok) = batch_with(ctx, parts, req, forwarded, Vec::new(), Vec::new()).await;
        mark_batch_deleted(strict, queue, &sent, &ok);
        return Some(resp);
    }
    strict.count("stale_delete", local.len() as u64);
    let sent = forwarded.clone();
    let (resp, ok) = batch_with(ctx, parts, req, forwarded, local, Vec::new()).await;
    mark_batch_deleted(strict, queue, &sent, &ok);
    Some(resp)
}

fn mark_batch_deleted(strict: &Strict, queue: &str, sent: &[Value], ok: &[Value]) {
    let ok = ids_of(ok);
    for e in sent {
        if e.get("Id")
            .and_then(Value::as_str)
            .is_some_and(|id| ok.contains(id))
        {
            strict.mark_deleted(queue, &entry_handle(e));
        }
    }
}

async fn visibility_one(
    ctx: &Ctx,
    strict: &Strict,
    parts: &hyper::http::request::Parts,
    req: &Value,
    queue: &str,
    request_id: &str,
) -> Option<Response<Full<Bytes>>> {
    let handle = req.get("ReceiptHandle").and_then(Value::as_str)?.to_string();
    match strict.handle_state(queue, &handle) {
        HandleState::Unknown => None,
        HandleState::Stale => {
            strict.count("stale_visibility", 1);
            Some(sqs_error(
                400,
                "InvalidParameterValue",
                &stale_visibility_message(&handle),
                request_id,
            ))
        }
        HandleState::Latest => {
            let resp = forward_json(ctx, parts, req).await;
            if resp.status().is_success() {
                let s = req.get("VisibilityTimeout").and_then(Value::as_u64).unwrap_or(0);
                strict.set_visibility(queue, &handle, s);
            }
            Some(resp)
        }
    }
}

async fn visibility_batch(
    ctx: &Ctx,
    strict: &Strict,
    parts: &hyper::http::request::Parts,
    req: Value,
    queue: &str,
) -> Option<Response<Full<Bytes>>> {
    let (mut forwarded, mut failed) = (Vec::new(), Vec::new());
    for e in entries(&req) {
        let handle = entry_handle(&e);
        match strict.handle_state(queue, &handle) {
            HandleState::Stale => failed.push(json!({
                "Id": entry_id(&e),
                "SenderFault": true,
                "Code": "InvalidParameterValue",
                "Message": stale_visibility_message(&handle),
            })),
            _ => forwarded.push(e),
        }
    }
    strict.count("stale_visibility", failed.len() as u64);
    let sent = forwarded.clone();
    let (resp, ok) = batch_with(ctx, parts, req, forwarded, Vec::new(), failed).await;
    let ok = ids_of(&ok);
    for e in &sent {
        if e.get("Id")
            .and_then(Value::as_str)
            .is_some_and(|id| ok.contains(id))
        {
            let s = e.get("VisibilityTimeout").and_then(Value::as_u64).unwrap_or(0);
            strict.set_visibility(queue, &entry_handle(e), s);
        }
    }
    Some(resp)
}

// ---------------------------------------------------------------- send

/// Whether `c` is one of SQS's characters.
pub fn sqs_char(c: char) -> bool {
    matches!(c, '\u{9}' | '\u{A}' | '\u{D}' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}')
}

fn valid_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    !name.is_empty()
        && name.len() <= 256
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !name.starts_with('.')
        && !name.ends_with('.')
        && !name.contains("..")
        && !lower.starts_with("aws.")
        && !lower.starts_with("amazon.")
}

fn valid_type(t: &str) -> bool {
    let base = t.split_once('.').map_or(t, |(b, _)| b);
    t.len() <= 256 && matches!(base, "String" | "Number" | "Binary") && !t.ends_with('.')
}

/// SQS's refusal of one message (code, message), if it refuses it.
fn refusal(m: &Value, max_size: usize) -> Option<(&'static str, String)> {
    const CHARS: &str = "Invalid characters found. Valid unicode characters are #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF";
    let body = m.get("MessageBody").and_then(Value::as_str).unwrap_or_default();
    if !body.chars().all(sqs_char) {
        return Some(("InvalidMessageContents", CHARS.to_string()));
    }
    let mut size = body.len();
    if let Some(attrs) = m.get("MessageAttributes").and_then(Value::as_object) {
        if attrs.len() > 10 {
            return Some((
                "InvalidParameterValue",
                format!(
                    "Number of message attributes [{}] exceeds the allowed maximum [10].",
                    attrs.len()
                ),
            ));
        }
        for (name, a) in attrs {
            if !valid_name(name) {
                return Some((
                    "InvalidParameterValue",
                    format!("Message (user) attribute name '{name}' is invalid."),
                ));
            }
            let t = a.get("DataType").and_then(Value::as_str).unwrap_or_default();
            if !valid_type(t) {
                return Some((
                    "InvalidParameterValue",
                    format!(
                        "The type of message (user) attribute '{name}' is invalid. You must use only the following supported type prefixes: Binary, Number, String."
                    ),
                ));
            }
            let value = a.get("StringValue").and_then(Value::as_str);
            if value.is_some_and(|v| !v.chars().all(sqs_char)) {
                return Some(("InvalidMessageContents", CHARS.to_string()));
            }
            size += name.len() + t.len() + value.map_or(0, str::len);
            size += a
                .get("BinaryValue")
                .and_then(Value::as_str)
                .map_or(0, super::base64_decoded_len);
        }
    }
    if size > max_size {
        return Some((
            "InvalidParameterValue",
            format!(
                "One or more parameters are invalid. Reason: Message must be shorter than {max_size} bytes."
            ),
        ));
    }
    None
}

fn dedup_key(m: &Value, a: &QueueAttrs) -> Option<String> {
    let id = match m.get("MessageDeduplicationId").and_then(Value::as_str) {
        Some(id) => id.to_string(),
        None if a.content_dedup => {
            use sha2::Digest;
            let body = m.get("MessageBody").and_then(Value::as_str).unwrap_or_default();
            sha2::Sha256::digest(body.as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        }
        None => return None,
    };
    let group = if a.dedup_per_group {
        m.get("MessageGroupId")
            .and_then(Value::as_str)
            .unwrap_or_default()
    } else {
        ""
    };
    Some(format!("{group}\u{0}{id}"))
}

/// The first send's answer for a deduplication key still in its window.
fn deduplicated(strict: &Strict, queue: &str, key: &str) -> Option<Value> {
    let queues = lock(&strict.queues);
    let (at, answer) = queues.get(queue)?.dedup.get(key)?;
    (at.elapsed() < DEDUP_WINDOW).then(|| answer.clone())
}

fn remember(strict: &Strict, queue: &str, key: String, answer: Value) {
    let mut queues = lock(&strict.queues);
    let q = queues.entry(queue.to_string()).or_default();
    let live = q
        .dedup
        .get(&key)
        .is_some_and(|(at, _)| at.elapsed() < DEDUP_WINDOW);
    if !live {
        q.dedup.insert(key, (Instant::now(), answer));
    }
}

async fn send(
    ctx: &Ctx,
    strict: &Strict,
    parts: &hyper::http::request::Parts,
    req: Value,
    queue: &str,
    batch: bool,
    request_id: &str,
) -> Option<Response<Full<Bytes>>> {
    let url = req
        .get("QueueUrl")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let a = attrs(ctx, strict, parts, &url).await?;
    if !batch {
        if let Some((code, message)) = refusal(&req, a.max_size) {
            strict.count("refused_send", 1);
            return Some(sqs_error(400, code, &message, request_id));
        }
        let key = if a.fifo { dedup_key(&req, &a) } else { None };
        if let Some(key) = key {
            if let Some(first) = deduplicated(strict, queue, &key) {
                strict.count("dedup_dropped", 1);
                return Some(json_response(200, &first, request_id));
            }
            let resp = forward_json(ctx, parts, &req).await;
            if resp.status() != StatusCode::OK {
                return Some(resp);
            }
            let (rparts, bytes) = split(resp).await;
            if let Ok(answer) = serde_json::from_slice::<Value>(&bytes) {
                remember(strict, queue, key, answer);
            }
            return Some(Response::from_parts(rparts, Full::new(bytes)));
        }
        return Some(forward_json(ctx, parts, &req).await);
    }
    let (mut forwarded, mut successful, mut failed) = (Vec::new(), Vec::new(), Vec::new());
    // Entries forwarded, with their deduplication keys; later entries of this batch with the
    // same key as a forwarded one, answered once the first's answer is known.
    let mut keys: HashMap<String, Value> = HashMap::new();
    let mut same_batch: Vec<(Value, String)> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    for e in entries(&req) {
        if let Some((code, message)) = refusal(&e, a.max_size) {
            strict.count("refused_send", 1);
            failed.push(json!({ "Id": entry_id(&e), "SenderFault": true, "Code": code, "Message": message }));
            continue;
        }
        let key = if a.fifo { dedup_key(&e, &a) } else { None };
        if let Some(key) = key {
            if let Some(mut first) = deduplicated(strict, queue, &key) {
                strict.count("dedup_dropped", 1);
                first["Id"] = entry_id(&e);
                successful.push(first);
                continue;
            }
            if !seen.insert(key.clone()) {
                strict.count("dedup_dropped", 1);
                same_batch.push((entry_id(&e), key));
                continue;
            }
            keys.insert(key, entry_id(&e));
        }
        forwarded.push(e);
    }
    let (resp, ok) = batch_with(ctx, parts, req, forwarded, successful, failed).await;
    if keys.is_empty() {
        return Some(resp);
    }
    let by_id: HashMap<String, Value> = ok
        .iter()
        .filter_map(|e| Some((e.get("Id")?.as_str()?.to_string(), e.clone())))
        .collect();
    for (key, id) in &keys {
        if let Some(answer) = id.as_str().and_then(|id| by_id.get(id)) {
            remember(strict, queue, key.clone(), answer.clone());
        }
    }
    if same_batch.is_empty() {
        return Some(resp);
    }
    let (rparts, bytes) = split(resp).await;
    let Ok(mut answer) = serde_json::from_slice::<Value>(&bytes) else {
        return Some(Response::from_parts(rparts, Full::new(bytes)));
    };
    for (id, key) in same_batch {
        // Answered as the batch's first entry with that key was: its success, or its failure.
        let (list, mut entry) = match deduplicated(strict, queue, &key) {
            Some(first) => ("Successful", first),
            None => {
                let first_id = keys.get(&key).cloned().unwrap_or(Value::Null);
                let failure = answer
                    .get("Failed")
                    .and_then(Value::as_array)
                    .and_then(|f| f.iter().find(|e| e.get("Id") == Some(&first_id)))
                    .cloned();
                match failure {
                    Some(f) => ("Failed", f),
                    None => continue,
                }
            }
        };
        entry["Id"] = id;
        if let Some(l) = answer.get_mut(list).and_then(Value::as_array_mut) {
            l.push(entry);
        }
    }
    Some(rebuild(rparts, &answer))
}
