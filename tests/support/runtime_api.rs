//! A local Lambda Runtime API: the HTTP interface a Lambda execution environment's runtime
//! polls (`GET /2018-06-01/runtime/invocation/next`, `POST .../{id}/response`,
//! `POST .../{id}/error`, `POST .../runtime/init/error`).
//!
//! Point a function binary at it with `AWS_LAMBDA_RUNTIME_API=<address>` and hand it events
//! with [`RuntimeApi::invoke`]. As in Lambda, one environment runs one invocation at a time,
//! the deadline (`Lambda-Runtime-Deadline-Ms`, epoch milliseconds) starts when the runtime
//! takes the event, and an invocation that has not answered by its deadline has timed out
//! (the caller then replaces the environment, as Lambda does).
//!
//! One `RuntimeApi` serves one process: a restarted environment gets a new one, so an event
//! can never be handed to a long poll left open by a killed process.
//!
//! It also serves the Extensions API on the same address, as Lambda does
//! (`POST /2020-01-01/extension/register`, `GET /2020-01-01/extension/event/next`): an
//! extension registered for them gets an `INVOKE` event as each invocation starts and a
//! `SHUTDOWN` event from [`RuntimeApi::shutdown`].

#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::{Mutex as AsyncMutex, mpsc, oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};

/// How an invocation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The function's response body.
    Response(String),
    /// The function reported an error (the error body).
    Error(String),
    /// No answer by the deadline (plus the grace given to [`RuntimeApi::invoke`]).
    TimedOut,
    /// The environment never took the event.
    NotStarted,
}

struct Invocation {
    event: String,
    time_left: Duration,
    started: oneshot::Sender<()>,
    reply: oneshot::Sender<Outcome>,
}

struct Shared {
    queue: AsyncMutex<mpsc::UnboundedReceiver<Invocation>>,
    running: Mutex<HashMap<String, oneshot::Sender<Outcome>>>,
    init_errors: Mutex<Vec<String>>,
    ids: AtomicU64,
    /// Becomes true at the runtime's first poll for an event.
    polled: watch::Sender<bool>,
    /// Extensions registered, by name.
    extensions: Mutex<Vec<String>>,
    /// Events for the registered extensions (one extension per environment here).
    ext_tx: mpsc::UnboundedSender<String>,
    ext_rx: AsyncMutex<mpsc::UnboundedReceiver<String>>,
    /// `Lambda-Runtime-Client-Context` sent with each invocation, when set.
    client_context: Mutex<Option<String>>,
    /// Request ids handed out, in order.
    handed: Mutex<Vec<String>>,
    /// When each running invocation's event was handed out.
    handed_at: Mutex<HashMap<String, Instant>>,
    /// Each answered invocation's time from the event handed out to the answer received.
    served: Mutex<Vec<Duration>>,
}

/// A Runtime API server for one execution environment.
pub struct RuntimeApi {
    address: String,
    tx: mpsc::UnboundedSender<Invocation>,
    shared: Arc<Shared>,
    server: JoinHandle<()>,
}

impl RuntimeApi {
    /// Starts a server on a free loopback port, on the current Tokio runtime.
    pub async fn start() -> RuntimeApi {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind runtime API");
        let address = listener.local_addr().expect("local addr").to_string();
        let (tx, rx) = mpsc::unbounded_channel();
        let (ext_tx, ext_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            queue: AsyncMutex::new(rx),
            running: Mutex::new(HashMap::new()),
            init_errors: Mutex::new(Vec::new()),
            ids: AtomicU64::new(0),
            polled: watch::channel(false).0,
            extensions: Mutex::new(Vec::new()),
            ext_tx,
            ext_rx: AsyncMutex::new(ext_rx),
            client_context: Mutex::new(None),
            handed: Mutex::new(Vec::new()),
            handed_at: Mutex::new(HashMap::new()),
            served: Mutex::new(Vec::new()),
        });
        let server = tokio::spawn(serve(listener, shared.clone()));
        RuntimeApi {
            address,
            tx,
            shared,
            server,
        }
    }

    /// The value for `AWS_LAMBDA_RUNTIME_API` (`host:port`).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Waits (at most `within`) until the runtime has asked for its first event, i.e. the
    /// function finished its start-up; false if it did not.
    pub async fn ready(&self, within: Duration) -> bool {
        let mut polled = self.shared.polled.subscribe();
        matches!(
            tokio::time::timeout(within, polled.wait_for(|p| *p)).await,
            Ok(Ok(_))
        )
    }

    /// The names of the extensions registered so far.
    pub fn extensions(&self) -> Vec<String> {
        self.shared.extensions.lock().unwrap().clone()
    }

    /// Sends `SHUTDOWN` to the registered extensions.
    pub fn shutdown(&self) {
        let _ = self
            .shared
            .ext_tx
            .send(r#"{"eventType":"SHUTDOWN","shutdownReason":"spindown","deadlineMs":0}"#.to_owned());
    }

    /// Sends `value` as `Lambda-Runtime-Client-Context` with every invocation from now on.
    pub fn set_client_context(&self, value: &str) {
        *self.shared.client_context.lock().unwrap() = Some(value.to_owned());
    }

    /// The request ids handed to the runtime so far, in order.
    pub fn request_ids(&self) -> Vec<String> {
        self.shared.handed.lock().unwrap().clone()
    }

    /// Each answered invocation's time from its event handed to the runtime (the answer to
    /// its `/next`) to its response or error received, in the order they answered: the
    /// invocation's billed duration as Lambda measures it, without this caller's own wait.
    pub fn served_times(&self) -> Vec<Duration> {
        self.shared.served.lock().unwrap().clone()
    }

    /// Errors the runtime (or an extension) reported while starting.
    pub fn init_errors(&self) -> Vec<String> {
        self.shared.init_errors.lock().unwrap().clone()
    }

    /// Hands `event` to the function with `time_left` until its deadline and waits for the
    /// answer: at most `start_within` for the runtime to take it, then the time left plus
    /// `grace` for the answer.
    pub async fn invoke(
        &self,
        event: String,
        time_left: Duration,
        start_within: Duration,
        grace: Duration,
    ) -> Outcome {
        let (started, started_rx) = oneshot::channel();
        let (reply, reply_rx) = oneshot::channel();
        let invocation = Invocation {
            event,
            time_left,
            started,
            reply,
        };
        if self.tx.send(invocation).is_err() {
            return Outcome::NotStarted;
        }
        // Dropping `started_rx` on timeout withdraws the event: the server skips it.
        match tokio::time::timeout(start_within, started_rx).await {
            Ok(Ok(())) => {}
            _ => return Outcome::NotStarted,
        }
        match tokio::time::timeout(time_left + grace, reply_rx).await {
            Ok(Ok(outcome)) => outcome,
            _ => Outcome::TimedOut,
        }
    }
}

impl Drop for RuntimeApi {
    fn drop(&mut self) {
        // Aborting the accept loop drops its connection tasks with it.
        self.server.abort();
    }
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |req| route(req, shared.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        // Reap finished connections so the set does not grow without bound.
        while connections.try_join_next().is_some() {}
    }
}

fn reply(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_owned())));
    *r.status_mut() = status;
    r
}

async fn route(req: Request<Incoming>, shared: Arc<Shared>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let accepted = || reply(StatusCode::ACCEPTED, r#"{"status":"OK"}"#);
    Ok(match (method, parts.as_slice()) {
        (Method::GET, ["2018-06-01", "runtime", "invocation", "next"]) => next(&shared).await,
        (
            Method::POST,
            [
                "2018-06-01",
                "runtime",
                "invocation",
                id,
                kind @ ("response" | "error"),
            ],
        ) => {
            let body = match req.into_body().collect().await {
                Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
                Err(_) => return Ok(reply(StatusCode::BAD_REQUEST, "unreadable body")),
            };
            let Some(waiter) = shared.running.lock().unwrap().remove(*id) else {
                return Ok(reply(StatusCode::NOT_FOUND, "unknown request id"));
            };
            if let Some(at) = shared.handed_at.lock().unwrap().remove(*id) {
                shared.served.lock().unwrap().push(at.elapsed());
            }
            let _ = waiter.send(if *kind == "response" {
                Outcome::Response(body)
            } else {
                Outcome::Error(body)
            });
            accepted()
        }
        (
            Method::POST,
            ["2018-06-01", "runtime", "init", "error"] | ["2020-01-01", "extension", "init", "error"],
        ) => {
            let body = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let text = String::from_utf8_lossy(&body).into_owned();
            shared.init_errors.lock().unwrap().push(text);
            accepted()
        }
        (Method::POST, ["2020-01-01", "extension", "register"]) => {
            let name = req
                .headers()
                .get("lambda-extension-name")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            if name.is_empty() {
                return Ok(reply(StatusCode::BAD_REQUEST, "no Lambda-Extension-Name"));
            }
            let mut names = shared.extensions.lock().unwrap();
            names.push(name);
            let mut r = reply(
                StatusCode::OK,
                r#"{"functionName":"triage-local","functionVersion":"$LATEST","handler":"handler.handler"}"#,
            );
            let id = format!("ext-{}", names.len());
            r.headers_mut()
                .insert("lambda-extension-identifier", id.parse().expect("header value"));
            r
        }
        (Method::GET, ["2020-01-01", "extension", "event", "next"]) => {
            let known = req
                .headers()
                .get("lambda-extension-identifier")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|id| id.starts_with("ext-"));
            if !known {
                return Ok(reply(StatusCode::FORBIDDEN, "unknown extension identifier"));
            }
            let mut rx = shared.ext_rx.lock().await;
            match rx.recv().await {
                Some(event) => reply(StatusCode::OK, &event),
                None => reply(StatusCode::SERVICE_UNAVAILABLE, "stopped"),
            }
        }
        _ => reply(StatusCode::NOT_FOUND, "not a Runtime API path"),
    })
}

/// The long poll: waits for the next event that its caller still wants.
async fn next(shared: &Shared) -> Response<Full<Bytes>> {
    shared.polled.send_replace(true);
    let mut queue = shared.queue.lock().await;
    loop {
        let Some(inv) = queue.recv().await else {
            return reply(StatusCode::SERVICE_UNAVAILABLE, "runtime API stopped");
        };
        if inv.started.send(()).is_err() {
            continue;
        }
        let id = format!("req-{:06}", shared.ids.fetch_add(1, Ordering::Relaxed));
        let deadline = epoch_ms() + inv.time_left.as_millis() as u64;
        shared.running.lock().unwrap().insert(id.clone(), inv.reply);
        shared.handed.lock().unwrap().push(id.clone());
        if !shared.extensions.lock().unwrap().is_empty() {
            let _ = shared.ext_tx.send(format!(
                r#"{{"eventType":"INVOKE","deadlineMs":{deadline},"requestId":"{id}","invokedFunctionArn":"arn:aws:lambda:us-east-1:000000000000:function:triage-local"}}"#
            ));
        }
        let client_context = shared.client_context.lock().unwrap().clone();
        let mut r = reply(StatusCode::OK, &inv.event);
        let headers = r.headers_mut();
        let mut set = |k: &'static str, v: String| {
            headers.insert(k, v.parse().expect("header value"));
        };
        set("content-type", "application/json".into());
        let id_for_time = id.clone();
        set("lambda-runtime-aws-request-id", id);
        set("lambda-runtime-deadline-ms", deadline.to_string());
        set(
            "lambda-runtime-invoked-function-arn",
            "arn:aws:lambda:us-east-1:000000000000:function:triage-local".into(),
        );
        set(
            "lambda-runtime-trace-id",
            "Root=1-00000000-000000000000000000000000;Sampled=0".into(),
        );
        if let Some(cc) = client_context {
            set("lambda-runtime-client-context", cc);
        }
        shared
            .handed_at
            .lock()
            .unwrap()
            .insert(id_for_time, Instant::now());
        return r;
    }
}
