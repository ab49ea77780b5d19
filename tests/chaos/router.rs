//! A loopback router in front of the two fault proxies: an `SdkConfig` can carry only one
//! endpoint that the SDK honours over `AWS_ENDPOINT_URL_<SERVICE>`, so every client of an
//! environment under test points here and the router sends each request on by its
//! `X-Amz-Target` (`DynamoDB_20120810.*` → DynamoDB, anything else → SQS).
//!
//! A fault proxy's `Reset` closes the router's upstream connection without an answer; the
//! router then drops the client's connection too, so the SDK sees the reset.
//!
//! A router given a [`Tap`] logs each call's outcome in a [`WireLog`]; a call the client gives
//! up while it is forwarded (its connection closes) is logged as abandoned.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::oneshot;

use super::wire::{Answer, WireLog};

/// Where a router logs the calls it forwards, and under which source (one per process whose
/// death the accounting must know about).
#[derive(Clone)]
pub struct Tap {
    pub log: Arc<WireLog>,
    pub source: u32,
}

type Upstream = Client<HttpConnector, Full<Bytes>>;

/// The running router; dropping it stops it.
pub struct Router {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Router {
    /// Routes DynamoDB calls to `ddb` and the rest to `sqs` (both `http://host:port`),
    /// logging them in `tap`.
    pub fn start(sqs: &str, ddb: &str, tap: Tap) -> Router {
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
                    let (client, sqs, ddb, tap) = (client.clone(), sqs.clone(), ddb.clone(), tap.clone());
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                            forward(client.clone(), sqs.clone(), ddb.clone(), tap.clone(), req)
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
    tap: Tap,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, BoxError> {
    let target = req
        .headers()
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let to_ddb = target.starts_with("DynamoDB");
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
    // Logged as abandoned if this future is dropped before the answer (the client left).
    let call = tap.log.begin(tap.source, &target, &body);
    let answer = async {
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
        Ok::<_, BoxError>((parts, body))
    }
    .await;
    match answer {
        Ok((parts, body)) => {
            // The fault proxy's own answers carry its request ids: never forwarded.
            let injected = parts
                .headers
                .get("x-amzn-requestid")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|id| id.starts_with("fault-proxy-"));
            call.answered(Answer::Http {
                status: parts.status.as_u16(),
                injected,
                body: &body,
            });
            Ok(Response::from_parts(parts, Full::new(body)))
        }
        Err(e) => {
            call.answered(Answer::Reset);
            Err(e)
        }
    }
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

/// The wire log's premise: a call the product gives up while the router waits for its answer
/// is logged as abandoned (here a DLQ send, which may then have landed unheard).
#[tokio::test]
async fn a_call_given_up_while_forwarded_is_logged_as_abandoned() {
    use std::io::Read;
    use tokio::io::AsyncWriteExt;

    // An upstream that reads the request and never answers.
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", upstream.local_addr().unwrap());
    let (read_tx, read_rx) = oneshot::channel();
    std::thread::spawn(move || {
        let (mut s, _) = upstream.accept().unwrap();
        let _ = s.read(&mut [0u8; 4096]);
        let _ = read_tx.send(());
        std::thread::sleep(Duration::from_secs(30));
    });
    let log = super::wire::WireLog::new();
    let router = Router::start(
        &url,
        &url,
        Tap {
            log: log.clone(),
            source: 0,
        },
    );
    let body =
        r#"{"QueueUrl":"http://h/0/q-dlq","Entries":[{"Id":"e0","MessageBody":"{\"id\":\"job-1\"}"}]}"#;
    let request = format!(
        "POST / HTTP/1.1\r\nhost: h\r\nx-amz-target: AmazonSQS.SendMessageBatch\r\n\
         content-type: application/x-amz-json-1.0\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut client = tokio::net::TcpStream::connect(router.addr).await.unwrap();
    client.write_all(request.as_bytes()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), read_rx)
        .await
        .expect("the request reached the upstream")
        .unwrap();
    drop(client);
    let logged = async {
        loop {
            let w = log.witnesses("http://h/0/q", "q-dlq", "-");
            if w.get("job-1").is_some_and(|w| w.unsure_sends == 1) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), logged)
        .await
        .expect("the abandoned send is logged");
}
