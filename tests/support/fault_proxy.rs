//! A fault-injecting, request-counting HTTP/1.1 proxy for tests and benches.
//!
//! The local emulators never throttle or fail, so tests put this proxy between the
//! AWS SDK and moto / DynamoDB Local:
//!
//! ```ignore
//! let proxy = FaultProxy::start("http://127.0.0.1:45661");
//! let ddb = ddb_client_via(&proxy.url()).await;
//! proxy.fail_next(2, Fault::Throttle, None);
//! ```
//!
//! Requests are forwarded unchanged (method, path, headers including the signed
//! `Host`, body). Operations are named from the `X-Amz-Target` header
//! (`DynamoDB_20120810.UpdateItem` → `UpdateItem`, `AmazonSQS.SendMessageBatch` →
//! `SendMessageBatch`). Injected errors look like the real services' JSON-protocol
//! errors, so the SDK parses and classifies them exactly as it would in AWS:
//!
//! * DynamoDB (awsJson1_0): HTTP 400, `{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"..."}`.
//! * SQS (awsJson1_0 with `@awsQueryCompatible`): HTTP 400, `{"__type":"...#ThrottlingException","message":"..."}`
//!   plus the header `x-amzn-query-error: ThrottlingException;Sender`. The SDK takes the code from
//!   `__type` (namespace before `#` stripped) and then overrides it with the part of
//!   `x-amzn-query-error` before `;`, so both must name the same code.
//!
//! The proxy runs on its own thread with its own Tokio runtime, so it works from
//! synchronous code and from any kind of test runtime; it shuts down on drop.

#![allow(dead_code)]

pub mod strict;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{oneshot, watch};

/// One kind of injected fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The service's own throttling error. DynamoDB: `ProvisionedThroughputExceededException`;
    /// SQS: `ThrottlingException` (with `x-amzn-query-error: ThrottlingException;Sender`). HTTP 400.
    Throttle,
    /// `ThrottlingException` for either service. HTTP 400.
    ThrottlingException,
    /// SQS: `RequestThrottled`; DynamoDB: `RequestLimitExceeded`. HTTP 400.
    RequestThrottled,
    /// HTTP 500 with a JSON error body (`InternalServerError` / `InternalFailure`).
    Status500,
    /// HTTP 503 with a JSON error body (`ServiceUnavailable`).
    Status503,
    /// Read the whole request, then close the connection without any response.
    Reset,
    /// Forward the request (the service acts on it), then close the connection without the
    /// answer: a call whose first try landed, retried by a client that never heard back.
    LostAnswer,
    /// Wait this long, then forward the request normally (latency injection).
    Delay(Duration),
    /// Hold the request until [`FaultProxy::release_held`], then forward it normally: a test
    /// sees which requests are on the wire at once ([`FaultProxy::until_held`]) without timing.
    Hold,
    /// Wait this long, then forward the request even if the client has stopped waiting for
    /// it: a request already on its way that reaches the service late, after requests the
    /// client sent later.
    LateDelivery(Duration),
    /// Any error response: `code` is the short error code (e.g. `AccessDeniedException`,
    /// `InvalidParameterValue`, `ConditionalCheckFailedException`); it goes into `__type`
    /// and, for SQS, into `x-amzn-query-error`.
    Error { status: u16, code: String },
    /// Answer with this HTTP status and raw JSON body without forwarding the request (e.g.
    /// `200` and `{}`: a success that lists no entry at all).
    Body { status: u16, body: String },
}

impl Fault {
    /// The name under which [`FaultProxy::faults`] counts this fault.
    pub fn kind_name(&self) -> String {
        match self {
            Fault::Throttle => "Throttle".into(),
            Fault::ThrottlingException => "ThrottlingException".into(),
            Fault::RequestThrottled => "RequestThrottled".into(),
            Fault::Status500 => "Status500".into(),
            Fault::Status503 => "Status503".into(),
            Fault::Reset => "Reset".into(),
            Fault::LostAnswer => "LostAnswer".into(),
            Fault::Delay(_) => "Delay".into(),
            Fault::Hold => "Hold".into(),
            Fault::LateDelivery(_) => "LateDelivery".into(),
            Fault::Error { code, .. } => format!("Error:{code}"),
            Fault::Body { status, .. } => format!("Body:{status}"),
        }
    }
}

/// Random faults: each matching request fails with probability `share`, with a kind
/// drawn uniformly from `kinds`. Deterministic for a given seed and request order.
#[derive(Clone, Debug)]
pub struct FaultPlan {
    /// Probability in `[0, 1]` that a matching request gets a fault.
    pub share: f64,
    /// Kinds to draw from (uniformly). Empty means no faults.
    pub kinds: Vec<Fault>,
    /// Operation names (e.g. `UpdateItem`) the plan applies to; `None` = all.
    pub only_ops: Option<Vec<String>>,
    /// Requests whose body contains this string are never faulted by the plan (e.g. the
    /// table a test's oracle writes to through the same endpoint).
    pub spare_body_containing: Option<String>,
    /// Seed of the plan's `StdRng`.
    pub seed: u64,
}

/// A deterministic rule, checked before the random plan, first match wins.
#[derive(Clone, Debug)]
pub struct FaultRule {
    /// Operation names the rule applies to; `None` = all.
    pub ops: Option<Vec<String>>,
    /// Only requests whose body contains this string (e.g. a DLQ's queue URL or name).
    pub body_contains: Option<String>,
    pub fault: Fault,
    /// `Some(n)`: only the next `n` matching requests, then the rule is removed.
    /// `None`: every matching request, until [`FaultProxy::clear_faults`].
    pub times: Option<u64>,
}

impl FaultRule {
    fn matches(&self, op: &str, body: &[u8]) -> bool {
        let op_ok = self.ops.as_ref().is_none_or(|ops| ops.iter().any(|o| o == op));
        let body_ok = self
            .body_contains
            .as_ref()
            .is_none_or(|needle| contains(body, needle.as_bytes()));
        op_ok && body_ok
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

#[derive(Default)]
struct Counters {
    total: u64,
    ops: BTreeMap<String, u64>,
    faults: BTreeMap<String, u64>,
    /// Time spent waiting for the upstream's answers, per operation.
    upstream: BTreeMap<String, Duration>,
}

struct ActivePlan {
    plan: FaultPlan,
    rng: StdRng,
}

#[derive(Default)]
struct Faults {
    rules: Vec<FaultRule>,
    plan: Option<ActivePlan>,
}

#[derive(Default)]
struct Shared {
    counters: Mutex<Counters>,
    faults: Mutex<Faults>,
    request_ids: AtomicU64,
    /// SQS's cap on a SendMessageBatch payload, when enforced (see
    /// [`FaultProxy::enforce_batch_cap`]).
    batch_cap: Mutex<Option<usize>>,
    /// SQS's rules that moto does not keep, when the proxy is strict ([`FaultProxy::start_strict`]).
    strict: Option<strict::Strict>,
    /// Requests held by [`Fault::Hold`] so far.
    held: watch::Sender<u64>,
    /// Becomes true at [`FaultProxy::release_held`]: held requests go on, later ones pass.
    released: watch::Sender<bool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Counts the request and picks the fault for it, if any.
    fn on_request(&self, op: &str, body: &[u8]) -> Option<Fault> {
        let fault = {
            let mut f = lock(&self.faults);
            let mut chosen = None;
            if let Some(i) = f.rules.iter().position(|r| r.matches(op, body)) {
                let rule = &mut f.rules[i];
                chosen = Some(rule.fault.clone());
                if let Some(n) = rule.times.as_mut() {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        f.rules.remove(i);
                    }
                }
            } else if let Some(active) = f.plan.as_mut() {
                let spared = active
                    .plan
                    .spare_body_containing
                    .as_ref()
                    .is_some_and(|s| contains(body, s.as_bytes()));
                let applies = !spared
                    && active
                        .plan
                        .only_ops
                        .as_ref()
                        .is_none_or(|ops| ops.iter().any(|o| o == op));
                if applies && !active.plan.kinds.is_empty() {
                    let share = active.plan.share.clamp(0.0, 1.0);
                    if active.rng.random_bool(share) {
                        let k = active.rng.random_range(0..active.plan.kinds.len());
                        chosen = Some(active.plan.kinds[k].clone());
                    }
                }
            }
            chosen
        };
        let mut c = lock(&self.counters);
        c.total += 1;
        *c.ops.entry(op.to_string()).or_default() += 1;
        if let Some(fault) = &fault {
            *c.faults.entry(fault.kind_name()).or_default() += 1;
        }
        fault
    }
}

/// The running proxy. Dropping it stops it (the listener closes, open connections end).
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: String,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts a proxy on `127.0.0.1:<ephemeral>` forwarding to `upstream`
    /// (`http://host:port`, no path). Panics if it cannot bind.
    pub fn start(upstream: &str) -> FaultProxy {
        Self::start_with(upstream, Shared::default())
    }

    /// Starts a proxy that also holds every SQS call to real SQS's rules where moto is more
    /// lenient (retention, latest receipt handle, characters and attribute limits on sends, an
    /// in-flight cap, FIFO deduplication across deletes): see [`strict`]. Faults are injected
    /// before the rules apply, as with [`FaultProxy::start`].
    pub fn start_strict(upstream: &str) -> FaultProxy {
        Self::start_with(
            upstream,
            Shared {
                strict: Some(strict::Strict::default()),
                ..Shared::default()
            },
        )
    }

    fn start_with(upstream: &str, shared: Shared) -> FaultProxy {
        let upstream = upstream.trim_end_matches('/').to_string();
        let upstream_uri: Uri = upstream
            .parse()
            .expect("upstream must be an http://host:port URL");
        assert_eq!(
            upstream_uri.scheme_str(),
            Some("http"),
            "upstream must be plain http"
        );
        let authority = upstream_uri
            .authority()
            .expect("upstream needs host:port")
            .clone();

        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind fault proxy");
        listener.set_nonblocking(true).expect("nonblocking listener");
        let addr = listener.local_addr().expect("local addr");
        let shared = Arc::new(shared);
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();

        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("fault-proxy-{}", addr.port()))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("fault proxy runtime");
                rt.block_on(serve(listener, authority, thread_shared, shutdown_rx));
                // Dropping the runtime cancels every connection task.
            })
            .expect("spawn fault proxy thread");

        FaultProxy {
            addr,
            upstream,
            shared,
            shutdown: Some(shutdown_tx),
            thread: Some(thread),
        }
    }

    /// The endpoint to give the SDK, e.g. `http://127.0.0.1:39211`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    /// Requests received per operation (faulted ones included, so SDK retries show up).
    pub fn counts(&self) -> BTreeMap<String, u64> {
        lock(&self.shared.counters).ops.clone()
    }

    /// Time the upstream took to answer the forwarded requests, summed per operation (an
    /// injected delay not included): what the emulator adds to each call.
    pub fn upstream_times(&self) -> BTreeMap<String, Duration> {
        lock(&self.shared.counters).upstream.clone()
    }

    /// Requests received for one operation.
    pub fn count(&self, op: &str) -> u64 {
        lock(&self.shared.counters).ops.get(op).copied().unwrap_or(0)
    }

    /// Requests received in all.
    pub fn total(&self) -> u64 {
        lock(&self.shared.counters).total
    }

    /// Faults injected per kind ([`Fault::kind_name`]).
    pub fn faults(&self) -> BTreeMap<String, u64> {
        lock(&self.shared.counters).faults.clone()
    }

    /// Faults injected in all.
    pub fn faults_injected(&self) -> u64 {
        lock(&self.shared.counters).faults.values().sum()
    }

    /// Zeroes every counter (faults stay programmed).
    pub fn reset_counts(&self) {
        *lock(&self.shared.counters) = Counters::default();
    }

    /// Replaces the random fault plan (rules stay).
    pub fn set_faults(&self, plan: FaultPlan) {
        let rng = StdRng::seed_from_u64(plan.seed);
        lock(&self.shared.faults).plan = Some(ActivePlan { plan, rng });
    }

    /// Fails the next `n` requests matching `only_ops` (`None` = any operation) with `fault`.
    pub fn fail_next(&self, n: u64, fault: Fault, only_ops: Option<Vec<String>>) {
        if n == 0 {
            return;
        }
        self.add_rule(FaultRule {
            ops: only_ops,
            body_contains: None,
            fault,
            times: Some(n),
        });
    }

    /// Fails every request for operation `op` with `fault`, until [`Self::clear_faults`].
    pub fn fail_always(&self, op: &str, fault: Fault) {
        self.add_rule(FaultRule {
            ops: Some(vec![op.to_string()]),
            body_contains: None,
            fault,
            times: None,
        });
    }

    /// Adds a deterministic rule (checked in insertion order, before the random plan).
    pub fn add_rule(&self, rule: FaultRule) {
        lock(&self.shared.faults).rules.push(rule);
    }

    /// Waits until `n` requests in all have been held by [`Fault::Hold`] (at most `within`);
    /// false if fewer came.
    pub async fn until_held(&self, n: u64, within: Duration) -> bool {
        let mut held = self.shared.held.subscribe();
        matches!(
            tokio::time::timeout(within, held.wait_for(|h| *h >= n)).await,
            Ok(Ok(_))
        )
    }

    /// Lets every held request go on; a [`Fault::Hold`] after this holds nothing.
    pub fn release_held(&self) {
        self.shared.released.send_replace(true);
    }

    /// Removes every rule and the random plan.
    pub fn clear_faults(&self) {
        *lock(&self.shared.faults) = Faults::default();
    }

    /// A strict proxy's in-flight cap for one queue (its default is
    /// [`strict::DEFAULT_IN_FLIGHT_CAP`], or `SQS_TRIAGE_TEST_IN_FLIGHT_CAP`). No effect on a
    /// proxy that is not strict.
    pub fn set_in_flight_cap(&self, queue_url: &str, cap: u64) {
        if let Some(s) = &self.shared.strict {
            s.set_cap(queue_url, cap);
        }
    }

    /// A strict proxy hands every receive of this queue as many messages as SQS would at
    /// most, never fewer on purpose: for a test whose premise is a whole receive (it asserts
    /// that premise). No effect on a proxy that is not strict.
    pub fn receive_whole(&self, queue_url: &str) {
        if let Some(s) = &self.shared.strict {
            s.receive_whole(queue_url);
        }
    }

    /// A strict proxy takes every message of the queue to be `by` older than it is (for
    /// retention), so a test need not wait a minute for a message to expire.
    pub fn age_messages(&self, queue_url: &str, by: Duration) {
        if let Some(s) = &self.shared.strict {
            s.age(queue_url, by);
        }
    }

    /// How often each strict rule acted (`expired`, `stale_delete`, `stale_visibility`,
    /// `refused_send`, `over_limit`, `dedup_dropped`, `partial_receive`); empty for a proxy that
    /// is not strict.
    pub fn strict_counts(&self) -> BTreeMap<String, u64> {
        self.shared
            .strict
            .as_ref()
            .map(|s| s.counts().into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            .unwrap_or_default()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

type Upstream = Client<HttpConnector, Full<Bytes>>;

async fn serve(
    listener: std::net::TcpListener,
    authority: hyper::http::uri::Authority,
    shared: Arc<Shared>,
    mut shutdown: oneshot::Receiver<()>,
) {
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Upstream = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector);
    // Closed when the accept loop ends, which ends every open connection too.
    let (alive_tx, alive_rx) = watch::channel(());
    loop {
        let (stream, _) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(_) => continue,
            },
        };
        let _ = stream.set_nodelay(true);
        let ctx = Ctx {
            client: client.clone(),
            authority: authority.clone(),
            shared: shared.clone(),
        };
        let mut alive = alive_rx.clone();
        tokio::spawn(async move {
            // A `Reset` fault fires `kill`: the connection (and its socket) is dropped
            // without writing a response.
            let (kill_tx, mut kill_rx) = tokio::sync::mpsc::channel::<()>(1);
            let service = hyper::service::service_fn(move |req| {
                let ctx = ctx.clone();
                let kill_tx = kill_tx.clone();
                async move { handle(ctx, req, kill_tx).await }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                _ = kill_rx.recv() => {}
                _ = alive.changed() => {}
            }
        });
    }
    drop(alive_tx);
}

#[derive(Clone)]
struct Ctx {
    client: Upstream,
    authority: hyper::http::uri::Authority,
    shared: Arc<Shared>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Service {
    DynamoDb,
    Sqs,
    Other,
}

fn classify(req: &Request<Incoming>) -> (Service, String) {
    if let Some(target) = req.headers().get("x-amz-target").and_then(|v| v.to_str().ok()) {
        let (prefix, op) = target.rsplit_once('.').unwrap_or(("", target));
        let service = if prefix.starts_with("DynamoDB") {
            Service::DynamoDb
        } else if prefix.starts_with("AmazonSQS") {
            Service::Sqs
        } else {
            Service::Other
        };
        return (service, op.to_string());
    }
    (Service::Other, String::new())
}

/// Query-protocol fallback: `Action=Name` in a form body.
fn action_from_form(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    text.split('&')
        .find_map(|kv| kv.strip_prefix("Action=").map(str::to_string))
}

const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
];

fn strip_hop_by_hop(headers: &mut hyper::HeaderMap) {
    for h in HOP_BY_HOP {
        headers.remove(h);
    }
}

async fn handle(
    ctx: Ctx,
    req: Request<Incoming>,
    kill: tokio::sync::mpsc::Sender<()>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (service, mut op) = classify(&req);
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            // The client went away mid-request: nothing to answer.
            let _ = kill.try_send(());
            return Ok(std::future::pending::<Response<Full<Bytes>>>().await);
        }
    };
    if op.is_empty() {
        op = action_from_form(&body).unwrap_or_else(|| "Unknown".to_string());
    }

    let fault = ctx.shared.on_request(&op, &body);
    let request_id = format!(
        "fault-proxy-{}",
        ctx.shared.request_ids.fetch_add(1, Ordering::Relaxed)
    );
    match fault {
        None => {}
        Some(Fault::Delay(d)) => tokio::time::sleep(d).await,
        Some(Fault::Hold) => {
            let mut released = ctx.shared.released.subscribe();
            ctx.shared.held.send_modify(|n| *n += 1);
            let _ = released.wait_for(|r| *r).await;
        }
        Some(Fault::LateDelivery(d)) => {
            // Its own task: dropping this request's future (the client went away) does not
            // stop it.
            let late = tokio::spawn(async move {
                tokio::time::sleep(d).await;
                forward(&ctx, parts, body).await
            });
            return Ok(late
                .await
                .unwrap_or_else(|e| proxy_error(&format!("late delivery: {e}"))));
        }
        Some(Fault::LostAnswer) => {
            let _ = forward(&ctx, parts, body).await;
            let _ = kill.try_send(());
            return Ok(std::future::pending::<Response<Full<Bytes>>>().await);
        }
        Some(Fault::Reset) => {
            let _ = kill.try_send(());
            // Never answer; the connection task drops the socket.
            return Ok(std::future::pending::<Response<Full<Bytes>>>().await);
        }
        Some(Fault::Body { status, body }) => return Ok(raw_response(status, body, &request_id)),
        Some(fault) => return Ok(error_response(service, &fault, &request_id)),
    }
    if let Some(resp) = over_batch_cap(&ctx.shared, service, &op, &body, &request_id) {
        return Ok(resp);
    }
    if service == Service::Sqs {
        if let Some(resp) = strict::handle(&ctx, &parts, &op, &body, &request_id).await {
            return Ok(resp);
        }
    }
    let started = std::time::Instant::now();
    let answer = forward(&ctx, parts, body).await;
    *lock(&ctx.shared.counters).upstream.entry(op).or_default() += started.elapsed();
    Ok(answer)
}

/// Forwards a request upstream and returns the answer.
async fn forward(ctx: &Ctx, mut parts: hyper::http::request::Parts, body: Bytes) -> Response<Full<Bytes>> {
    // Forward unchanged: same method, path and query, headers (the signed Host
    // included; hyper-util keeps an existing Host header), body.
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .to_string();
    parts.uri = Uri::builder()
        .scheme("http")
        .authority(ctx.authority.clone())
        .path_and_query(path)
        .build()
        .expect("upstream uri");
    strip_hop_by_hop(&mut parts.headers);
    let upstream_req = Request::from_parts(parts, Full::new(body));
    match ctx.client.request(upstream_req).await {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            match body.collect().await {
                Ok(b) => {
                    strip_hop_by_hop(&mut parts.headers);
                    Response::from_parts(parts, Full::new(b.to_bytes()))
                }
                Err(e) => proxy_error(&format!("upstream body: {e}")),
            }
        }
        Err(e) => proxy_error(&format!("upstream request: {e}")),
    }
}

fn proxy_error(msg: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({ "__type": "FaultProxyUpstreamError", "message": msg }).to_string();
    Response::builder()
        .status(StatusCode::BAD_GATEWAY)
        .header(header::CONTENT_TYPE, "application/x-amz-json-1.0")
        .body(Full::new(Bytes::from(body)))
        .expect("proxy error response")
}

/// (HTTP status, `__type` with namespace, short code, message) for a fault.
fn error_parts(service: Service, fault: &Fault) -> (u16, String, String, String) {
    const DDB: &str = "com.amazonaws.dynamodb.v20120810#";
    const SQS: &str = "com.amazonaws.sqs#";
    const CORAL_AVAIL: &str = "com.amazon.coral.availability#";
    const CORAL_SERVICE: &str = "com.amazon.coral.service#";
    let (status, ns, code, message): (u16, &str, String, String) = match (service, fault) {
        (Service::DynamoDb, Fault::Throttle) => (
            400,
            DDB,
            "ProvisionedThroughputExceededException".into(),
            "The level of configured provisioned throughput for the table was exceeded. \
             Consider increasing your provisioning level with the UpdateTable API."
                .into(),
        ),
        (Service::DynamoDb, Fault::ThrottlingException) => (
            400,
            DDB,
            "ThrottlingException".into(),
            "Rate of requests exceeds the allowed throughput.".into(),
        ),
        (Service::DynamoDb, Fault::RequestThrottled) => (
            400,
            DDB,
            "RequestLimitExceeded".into(),
            "Throughput exceeds the current throughput limit for your account.".into(),
        ),
        (Service::DynamoDb, Fault::Status500) => (
            500,
            DDB,
            "InternalServerError".into(),
            "Internal server error".into(),
        ),
        (_, Fault::Throttle | Fault::ThrottlingException) => (
            400,
            CORAL_AVAIL,
            "ThrottlingException".into(),
            "Rate exceeded".into(),
        ),
        (Service::Sqs, Fault::RequestThrottled) => (
            400,
            SQS,
            "RequestThrottled".into(),
            "Request is throttled.".into(),
        ),
        (_, Fault::RequestThrottled) => (
            400,
            CORAL_AVAIL,
            "RequestThrottled".into(),
            "Request is throttled.".into(),
        ),
        (_, Fault::Status500) => (
            500,
            CORAL_SERVICE,
            "InternalFailure".into(),
            "Internal failure.".into(),
        ),
        (Service::DynamoDb, Fault::Status503) => (
            503,
            DDB,
            "ServiceUnavailable".into(),
            "Service unavailable".into(),
        ),
        (_, Fault::Status503) => (
            503,
            CORAL_AVAIL,
            "ServiceUnavailable".into(),
            "Service unavailable".into(),
        ),
        (_, Fault::Error { status, code }) => {
            let ns = match service {
                Service::DynamoDb => DDB,
                Service::Sqs => SQS,
                Service::Other => "",
            };
            (
                *status,
                ns,
                code.clone(),
                format!("{code} (injected by fault proxy)"),
            )
        }
        (
            _,
            Fault::Reset
            | Fault::LostAnswer
            | Fault::Delay(_)
            | Fault::Hold
            | Fault::LateDelivery(_)
            | Fault::Body { .. },
        ) => {
            unreachable!("not an error response")
        }
    };
    (status, format!("{ns}{code}"), code, message)
}

fn error_response(service: Service, fault: &Fault, request_id: &str) -> Response<Full<Bytes>> {
    let (status, type_name, code, message) = error_parts(service, fault);
    let body = serde_json::json!({ "__type": type_name, "message": message }).to_string();
    let mut resp = Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/x-amz-json-1.0")
        .header("x-amzn-requestid", request_id)
        .body(Full::new(Bytes::from(body)))
        .expect("error response");
    if service == Service::Sqs {
        // awsQueryCompatible: the SDK takes the error code from this header.
        let fault_side = if status >= 500 { "Receiver" } else { "Sender" };
        if let Ok(v) = HeaderValue::from_str(&format!("{code};{fault_side}")) {
            resp.headers_mut()
                .insert(HeaderName::from_static("x-amzn-query-error"), v);
        }
    }
    resp
}

impl FaultProxy {
    /// Enforces SQS's cap on a batch's payload as real SQS does and moto does not (moto counts
    /// bodies only): a `SendMessageBatch` whose entries' bodies plus message attributes (name,
    /// data type and value of each) add up to more than `cap` bytes is answered with SQS's
    /// `AWS.SimpleQueueService.BatchRequestTooLong` (HTTP 400, sender fault) and not forwarded.
    /// Counted under [`FaultProxy::faults`] as `BatchRequestTooLong`.
    pub fn enforce_batch_cap(&self, cap: usize) {
        *lock(&self.shared.batch_cap) = Some(cap);
    }
}

/// The bytes a SendMessageBatch request (JSON protocol) counts toward SQS's batch cap.
fn batch_payload_bytes(body: &[u8]) -> Option<usize> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let mut total = 0;
    for e in v.get("Entries")?.as_array()? {
        total += e.get("MessageBody").and_then(|b| b.as_str()).map_or(0, str::len);
        if let Some(attrs) = e.get("MessageAttributes").and_then(|a| a.as_object()) {
            for (name, a) in attrs {
                total += name.len();
                total += a.get("DataType").and_then(|t| t.as_str()).map_or(0, str::len);
                total += a.get("StringValue").and_then(|t| t.as_str()).map_or(0, str::len);
                // Binary values travel base64-encoded; SQS counts the decoded bytes.
                total += a
                    .get("BinaryValue")
                    .and_then(|t| t.as_str())
                    .map_or(0, base64_decoded_len);
            }
        }
    }
    Some(total)
}

/// The bytes a base64 text decodes to (its padding not counted).
fn base64_decoded_len(b: &str) -> usize {
    let pad = b.bytes().rev().take_while(|&c| c == b'=').count();
    (b.len() / 4 * 3).saturating_sub(pad)
}

fn over_batch_cap(
    shared: &Shared,
    service: Service,
    op: &str,
    body: &[u8],
    request_id: &str,
) -> Option<Response<Full<Bytes>>> {
    let cap = (*lock(&shared.batch_cap))?;
    if service != Service::Sqs || op != "SendMessageBatch" {
        return None;
    }
    let size = batch_payload_bytes(body)?;
    if size <= cap {
        return None;
    }
    *lock(&shared.counters)
        .faults
        .entry("BatchRequestTooLong".into())
        .or_default() += 1;
    let code = "AWS.SimpleQueueService.BatchRequestTooLong";
    let body = serde_json::json!({
        "__type": "com.amazonaws.sqs#BatchRequestTooLong",
        "message": format!("Batch requests cannot be longer than {cap} bytes. You have sent {size} bytes."),
    })
    .to_string();
    let mut resp = raw_response(400, body, request_id);
    resp.headers_mut().insert(
        HeaderName::from_static("x-amzn-query-error"),
        HeaderValue::from_str(&format!("{code};Sender")).expect("ascii header"),
    );
    Some(resp)
}

fn raw_response(status: u16, body: String, request_id: &str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/x-amz-json-1.0")
        .header("x-amzn-requestid", request_id)
        .body(Full::new(Bytes::from(body)))
        .expect("raw response")
}
