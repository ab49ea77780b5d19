//! The Runtime API the function's runtime polls, on a loopback port: each `next` takes one
//! invocation the extension queued (a record's own, or an event passed through), and the
//! runtime's `response` or `error` for it goes back to whoever queued it. Every other path
//! (`init/error`, SnapStart's `restore`) is forwarded to Lambda's Runtime API as it came.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::{Mutex as AsyncMutex, mpsc, oneshot, watch};

use super::http;

/// The header a runtime names its error type in.
pub(crate) const ERROR_TYPE: &str = "lambda-runtime-function-error-type";

/// An invocation waiting for the runtime to take it.
pub(crate) struct Pending {
    pub id: String,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
    pub reply: oneshot::Sender<Reply>,
}

/// The runtime's answer to one invocation.
#[derive(Debug)]
pub(crate) struct Reply {
    /// True for `/response`, false for `/error`.
    pub ok: bool,
    pub body: Bytes,
    /// Headers to pass on with it (content type, error type).
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

/// What the extension and the runtime's server share.
pub(crate) struct Hub {
    tx: mpsc::UnboundedSender<Pending>,
    rx: AsyncMutex<mpsc::UnboundedReceiver<Pending>>,
    /// Handed to the runtime and not answered yet, by request id.
    running: Mutex<HashMap<String, oneshot::Sender<Reply>>>,
    /// Becomes true at the runtime's first `next`: its init is over.
    ready: watch::Sender<bool>,
    /// Set once the runtime process is known gone: nothing queued will be taken.
    gone: AtomicBool,
    ids: AtomicU64,
    /// Lambda's Runtime API (`host:port`).
    pub(crate) upstream: String,
}

impl Hub {
    pub(crate) fn new(upstream: String) -> Arc<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        Arc::new(Self {
            tx,
            rx: AsyncMutex::new(rx),
            running: Mutex::new(HashMap::new()),
            ready: watch::channel(false).0,
            gone: AtomicBool::new(false),
            ids: AtomicU64::new(0),
            upstream,
        })
    }

    /// A request id of the extension's own, unique in this environment.
    pub(crate) fn fresh_id(&self, real: &str) -> String {
        format!("{real}-r{}", self.ids.fetch_add(1, Ordering::Relaxed))
    }

    /// Queues an invocation for the runtime; the answer comes on the returned receiver, which
    /// fails when the runtime is gone before answering.
    pub(crate) fn dispatch(
        &self,
        id: String,
        headers: Vec<(HeaderName, HeaderValue)>,
        body: Bytes,
    ) -> oneshot::Receiver<Reply> {
        let (reply, rx) = oneshot::channel();
        if !self.gone.load(Ordering::SeqCst) {
            let _ = self.tx.send(Pending {
                id,
                headers,
                body,
                reply,
            });
        }
        rx
    }

    /// Waits until the runtime asks for its first invocation.
    pub(crate) async fn wait_ready(&self) {
        let mut r = self.ready.subscribe();
        let _ = r.wait_for(|v| *v).await;
    }

    /// How many invocations the runtime holds unanswered (a handler still running).
    pub(crate) fn unanswered(&self) -> usize {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The runtime process is gone: every invocation it held, and every one queued, fails
    /// now (their receivers see the sender dropped).
    pub(crate) fn runtime_gone(&self) {
        self.gone.store(true, Ordering::SeqCst);
        self.running.lock().unwrap_or_else(|e| e.into_inner()).clear();
        if let Ok(mut rx) = self.rx.try_lock() {
            while rx.try_recv().is_ok() {}
        }
    }

    pub(crate) fn is_gone(&self) -> bool {
        self.gone.load(Ordering::SeqCst)
    }

    /// The runtime's long poll: the next queued invocation whose sender still waits.
    async fn next(&self) -> Response<Full<Bytes>> {
        self.ready.send_replace(true);
        let mut rx = self.rx.lock().await;
        loop {
            let Some(p) = rx.recv().await else {
                return reply(StatusCode::INTERNAL_SERVER_ERROR, "the extension stopped");
            };
            // Given up already (its record's time ran out before the runtime was free).
            if p.reply.is_closed() {
                continue;
            }
            self.running
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(p.id.clone(), p.reply);
            let mut r = Response::new(Full::new(p.body));
            let h = r.headers_mut();
            for (k, v) in p.headers {
                h.insert(k, v);
            }
            if let Ok(v) = HeaderValue::from_str(&p.id) {
                h.insert("lambda-runtime-aws-request-id", v);
            }
            return r;
        }
    }

    /// The runtime's answer for `id`. A late answer for an invocation whose record was
    /// already reported is accepted and dropped, so the runtime carries on.
    fn answer(&self, id: &str, reply: Reply) -> Response<Full<Bytes>> {
        let waiter = self.running.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
        match waiter {
            Some(w) => {
                let _ = w.send(reply);
                accepted()
            }
            None => reply_json(
                StatusCode::BAD_REQUEST,
                r#"{"errorMessage":"unknown request id","errorType":"InvalidRequestID"}"#,
            ),
        }
    }
}

fn reply(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_owned())));
    *r.status_mut() = status;
    r
}

fn reply_json(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut r = reply(status, body);
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    r
}

fn accepted() -> Response<Full<Bytes>> {
    reply_json(StatusCode::ACCEPTED, r#"{"status":"OK"}"#)
}

/// Serves the runtime on `listener` until the process ends.
pub(crate) async fn serve(listener: tokio::net::TcpListener, hub: Arc<Hub>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let hub = hub.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| route(req, hub.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Headers of the runtime's answer that go on with it.
fn kept_headers(req: &Request<Incoming>) -> Vec<(HeaderName, HeaderValue)> {
    req.headers()
        .iter()
        .filter(|(k, _)| {
            let k = k.as_str();
            k == "content-type" || k == ERROR_TYPE || k.starts_with("lambda-runtime-")
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

async fn route(req: Request<Incoming>, hub: Arc<Hub>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_owned();
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    Ok(match (req.method().clone(), parts.as_slice()) {
        (Method::GET, ["2018-06-01", "runtime", "invocation", "next"]) => hub.next().await,
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
            let ok = *kind == "response";
            let id = (*id).to_owned();
            let headers = kept_headers(&req);
            match req.into_body().collect().await {
                Ok(b) => hub.answer(
                    &id,
                    Reply {
                        ok,
                        body: b.to_bytes(),
                        headers,
                    },
                ),
                Err(_) => reply(StatusCode::BAD_REQUEST, "unreadable body"),
            }
        }
        _ => forward(req, &hub.upstream).await,
    })
}

/// Any other call goes to Lambda's Runtime API unchanged, and its answer back.
async fn forward(req: Request<Incoming>, upstream: &str) -> Response<Full<Bytes>> {
    let method = req.method().clone();
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "/".to_owned());
    let headers: Vec<(HeaderName, HeaderValue)> = req
        .headers()
        .iter()
        .filter(|(k, _)| *k != hyper::header::HOST && *k != hyper::header::CONTENT_LENGTH)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return reply(StatusCode::BAD_REQUEST, "unreadable body"),
    };
    match http::call(upstream, method, &path, &headers, body).await {
        Ok(a) => {
            let mut r = Response::new(Full::new(a.body));
            *r.status_mut() = a.status;
            for (k, v) in a.headers.iter() {
                if k != hyper::header::CONTENT_LENGTH && k != hyper::header::TRANSFER_ENCODING {
                    r.headers_mut().insert(k.clone(), v.clone());
                }
            }
            r
        }
        Err(e) => {
            tracing::error!(path, error = %e, "forwarding to Lambda's Runtime API failed");
            reply(StatusCode::BAD_GATEWAY, "Lambda's Runtime API cannot be reached")
        }
    }
}
