//! A loopback router in front of the two fault proxies: an `SdkConfig` can carry only one
//! endpoint that the SDK honours over `AWS_ENDPOINT_URL_<SERVICE>`, so every client of an
//! environment under test points here and the router sends each request on by its
//! `X-Amz-Target` (`DynamoDB_20120810.*` → DynamoDB, anything else → SQS).
//!
//! A fault proxy's `Reset` closes the router's upstream connection without an answer; the
//! router then drops the client's connection too, so the SDK sees the reset.

use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::oneshot;

type Upstream = Client<HttpConnector, Full<Bytes>>;

/// The running router; dropping it stops it.
pub struct Router {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Router {
    /// Routes DynamoDB calls to `ddb` and the rest to `sqs` (both `http://host:port`).
    pub fn start(sqs: &str, ddb: &str) -> Router {
        let authority = |u: &str| -> hyper::http::uri::Authority {
            u.parse::<Uri>().unwrap().authority().unwrap().clone()
        };
        let (sqs, ddb) = (authority(sqs), authority(ddb));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, mut rx) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let client: Upstream = Client::builder(TokioExecutor::new())
                    .pool_idle_timeout(Duration::from_secs(30))
                    .build(HttpConnector::new());
                loop {
                    let stream = tokio::select! {
                        _ = &mut rx => break,
                        a = listener.accept() => match a { Ok((s, _)) => s, Err(_) => continue },
                    };
                    let _ = stream.set_nodelay(true);
                    let (client, sqs, ddb) = (client.clone(), sqs.clone(), ddb.clone());
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                            forward(client.clone(), sqs.clone(), ddb.clone(), req)
                        });
                        // A service error (upstream reset) closes this connection unanswered.
                        let _ = hyper::server::conn::http1::Builder::new()
                            .keep_alive(true)
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            });
        });
        Router {
            addr,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    /// The endpoint to give the SDK.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn forward(
    client: Upstream,
    sqs: hyper::http::uri::Authority,
    ddb: hyper::http::uri::Authority,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, BoxError> {
    let to_ddb = req
        .headers()
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("DynamoDB"));
    let (mut parts, body) = req.into_parts();
    let body: Bytes = body
        .collect()
        .await
        .map_err(|e| -> BoxError { Box::new(e) })?
        .to_bytes();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    parts.uri = Uri::builder()
        .scheme("http")
        .authority(if to_ddb { ddb } else { sqs })
        .path_and_query(path)
        .build()?;
    let resp = client
        .request(Request::from_parts(parts, Full::new(body)))
        .await
        .map_err(|e| -> BoxError { Box::new(e) })?;
    let (parts, body) = resp.into_parts();
    let body: Bytes = body
        .collect()
        .await
        .map_err(|e| -> BoxError { Box::new(e) })?
        .to_bytes();
    Ok(Response::from_parts(parts, Full::new(body)))
}

impl Drop for Router {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
