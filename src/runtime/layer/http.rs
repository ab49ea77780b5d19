//! The few HTTP calls the extension makes to Lambda's own APIs (the Runtime API and the
//! Extensions API, both on `AWS_LAMBDA_RUNTIME_API`): one HTTP/1 connection per call over
//! loopback, no pool. A long poll holds its own connection, so calls never queue behind it.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;

use crate::runtime::RuntimeError;

/// An answer from Lambda's API.
#[derive(Debug)]
pub(crate) struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Sends one request to `address` (`host:port`) and reads the whole answer.
pub(crate) async fn call(
    address: &str,
    method: Method,
    path: &str,
    headers: &[(HeaderName, HeaderValue)],
    body: Bytes,
) -> Result<Answer, RuntimeError> {
    let stream = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|e| format!("cannot reach Lambda's API at {address}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("Lambda's API at {address}: {e}"))?;
    let conn = tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, address);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let req = req
        .body(Full::new(body))
        .map_err(|e| format!("request to {path}: {e}"))?;
    let res = send.send_request(req).await.map_err(|e| format!("{path}: {e}"))?;
    let status = res.status();
    let headers = res.headers().clone();
    let body = res
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{path}: reading the answer: {e}"))?
        .to_bytes();
    conn.abort();
    Ok(Answer {
        status,
        headers,
        body,
    })
}
