//! `triage console`: the DLQ and the breakers in a browser.
//!
//! A small web server in the `triage` binary, on the operator's own AWS credentials:
//! server-rendered pages (the overview, the DLQ grouped, a group's messages, one message in
//! full, the audit trail) and a confirmation page before every action. Every action calls the
//! same library functions as the CLI ([`crate::ops::dlq`], [`crate::ops::park`],
//! [`crate::ops::breaker`]) through a context that audits to the state table, so it lands in
//! the audit trail like the CLI's.
//!
//! Safe by default:
//! - it listens on 127.0.0.1 unless a bind address is given, and then a token is required
//!   (a cookie set by the printed URL, or `Authorization: Bearer`). Cookies are not isolated
//!   by port, so a browser would send a host-wide cookie to every other server on the host:
//!   with a token the pages live under a random path (`/s/<32 hex>`), the cookie is scoped
//!   to it, and `Referrer-Policy: same-origin` keeps it out of other origins' `Referer`;
//! - requests whose `Host` is not the address it listens on are refused (DNS rebinding); a
//!   loopback console answers to the loopback names on any port (an SSH tunnel);
//! - every request whose `Sec-Fetch-Site` says another site's page made it is refused, GET
//!   too (a read hides DLQ messages for a while);
//! - every state-changing request is a POST that carries the per-process CSRF token, and one
//!   whose `Origin` is not ours is refused;
//! - every text from a queue or a table is escaped ([`html::esc`]); the
//!   Content-Security-Policy allows no inline script or style, only the two embedded assets.

pub mod html;
mod pages;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rand::Rng;

use crate::ops::{Ctx, ErrorKind, OpsError, OpsResult};

/// The token's cookie, before the port: two consoles on one host keep one each
/// (`triage_console_token_8080`). Its `Path` is the console's secret prefix: a cookie is sent
/// to every port of its host, so one at `/` would reach any other server there.
const TOKEN_COOKIE: &str = "triage_console_token";

/// The shortest token accepted from `--token` or the environment.
pub const MIN_TOKEN_LEN: usize = 16;

/// The Content-Security-Policy of every response: the embedded script and style only, no
/// inline script or style, no frames, forms that post only here.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// What the console serves and how it is protected.
#[derive(Debug, Clone)]
pub struct ConsoleOptions {
    /// The source queue URL (resolved).
    pub queue_url: String,
    /// The DLQ URL (resolved).
    pub dlq_url: String,
    /// The state table (breakers, attempt ledgers, audit trail).
    pub table: String,
    /// The token every request must carry; `None` for no token (loopback only).
    pub token: Option<String>,
    /// The `Host` values accepted (`host:port`); `None` accepts any (a server bound to every
    /// interface, where the token is the protection).
    pub allowed_hosts: Option<Vec<String>>,
    /// Read at most this many DLQ messages per page or action.
    pub max_scan: usize,
    /// Who is at the keyboard (`$USER`), kept with a park.
    pub local_user: Option<String>,
    /// The port it listens on (it names the token's cookie).
    pub port: u16,
}

impl ConsoleOptions {
    /// The `Host` values a server listening on `addr` answers to: the address itself, and
    /// the loopback names when it is a loopback address; `None` (any) for an unspecified
    /// address (0.0.0.0 or ::).
    pub fn hosts_for(addr: SocketAddr) -> Option<Vec<String>> {
        let port = addr.port();
        let ip = addr.ip();
        if ip.is_unspecified() {
            return None;
        }
        let name = match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        };
        let mut hosts = vec![format!("{name}:{port}")];
        if port == 80 {
            // Browsers leave the default port out of `Host`.
            hosts.push(name);
        }
        if ip.is_loopback() {
            for h in LOOPBACK_NAMES {
                hosts.push(format!("{h}:{port}"));
            }
        }
        hosts.dedup();
        Some(hosts)
    }
}

/// The names of the loopback interface a browser may put in `Host`.
const LOOPBACK_NAMES: [&str; 3] = ["127.0.0.1", "localhost", "[::1]"];

/// Whether `host` (a `Host` header) names the loopback interface, with any port or none: an
/// SSH tunnel from another local port, or a browser that leaves out `:80`. No other site can
/// make a browser send such a `Host`, so DNS rebinding stays refused.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if !name.ends_with(':') && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    LOOPBACK_NAMES.iter().any(|l| l.eq_ignore_ascii_case(name))
}

/// Whether a request naming `host` is for this console.
fn host_allowed(allowed: &[String], host: &str) -> bool {
    allowed.iter().any(|a| a.eq_ignore_ascii_case(host))
        || (allowed.iter().any(|a| is_loopback_host(a)) && is_loopback_host(host))
}

/// A fresh random token (128 bits, hex).
pub fn random_token() -> String {
    let bytes: [u8; 16] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A token given by the operator: long enough to guess in no reasonable time.
pub fn check_token(token: &str) -> OpsResult<()> {
    // Letters, digits and `-_.~` only: the token travels in a URL and a cookie unencoded.
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-_.~".contains(c);
    if token.len() < MIN_TOKEN_LEN || !token.chars().all(allowed) {
        return Err(OpsError::usage(format!(
            "the console token must be at least {MIN_TOKEN_LEN} characters of letters, digits and -_.~: \
             pass another with --token or TRIAGE_CONSOLE_TOKEN, or none to have one generated"
        )));
    }
    Ok(())
}

/// The server's shared state.
pub(crate) struct App {
    pub(crate) ctx: Ctx,
    pub(crate) opts: ConsoleOptions,
    pub(crate) csrf: String,
    /// With a token, the path the pages are served under (`/s/<32 hex>`, random per process)
    /// and the token cookie's `Path`.
    prefix: Option<String>,
}

/// The console's routes over `ctx` (which should audit to `opts.table`).
pub fn router(ctx: Ctx, opts: ConsoleOptions) -> Router {
    let prefix = opts.token.as_ref().map(|_| format!("/s/{}", random_token()));
    let app = Arc::new(App {
        ctx,
        opts,
        csrf: random_token(),
        prefix,
    });
    let pages = pages::routes()
        .route("/assets/console.css", get(css))
        .route("/assets/console.js", get(js));
    // Under the prefix for a browser (its cookie goes nowhere else), at the root for scripts
    // with `Authorization: Bearer`.
    let routes = match &app.prefix {
        Some(p) => Router::new().nest(p, pages.clone()).merge(pages),
        None => pages,
    };
    routes
        .layer(axum::extract::DefaultBodyLimit::max(pages::MAX_BODY))
        .layer(from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

/// Serves the console on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    ctx: Ctx,
    opts: ConsoleOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(ctx, opts))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn css() -> Response {
    asset("text/css; charset=utf-8", include_str!("assets/console.css"))
}

async fn js() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("assets/console.js"),
    )
}

fn asset(kind: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind)], body).into_response()
}

/// Compares two secrets in time independent of where they differ.
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn header_str<'a>(headers: &'a HeaderMap, name: &header::HeaderName) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Every value of the cookies named `name`: another server of the host may set one of the
/// same name (cookies are not isolated by port), so none is taken for the only one.
fn cookies<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .filter(move |(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Host, token and cross-site checks before any handler; security headers on every answer.
async fn guard(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let mut resp = match prefix_of(&app, &req) {
        Ok(Some(p)) => under_prefix(check(&app, req, next, true).await, p).await,
        Ok(None) => check(&app, req, next, false).await,
        Err(redirect) => redirect,
    };
    let h = resp.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Not `no-referrer`: with it a browser sends `Origin: null` on a form's POST, and the
    // origin check above needs the real one. `same-origin` sends no `Referer` to another
    // origin (another port is one), so the secret prefix stays here.
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// The secret prefix when the request is under it. The overview is the prefix itself: the
/// prefix with a slash is redirected there.
#[allow(clippy::result_large_err)]
fn prefix_of<'a>(app: &'a App, req: &Request) -> Result<Option<&'a str>, Response> {
    let Some(prefix) = app.prefix.as_deref() else {
        return Ok(None);
    };
    match req.uri().path().strip_prefix(prefix) {
        Some("/") => {
            let to = match req.uri().query() {
                Some(q) => format!("{prefix}?{q}"),
                None => prefix.to_owned(),
            };
            Err(match HeaderValue::from_str(&to) {
                Ok(loc) => (StatusCode::SEE_OTHER, [(header::LOCATION, loc)]).into_response(),
                Err(_) => refuse(StatusCode::BAD_REQUEST, "the address cannot be kept"),
            })
        }
        Some(rest) if rest.is_empty() || rest.starts_with('/') => Ok(Some(prefix)),
        _ => Ok(None),
    }
}

/// A page served under `prefix`, its links, forms and assets moved under it too. Only the
/// markup the console writes has `href="/` and the like: every text from a queue or a
/// request is escaped, its `"` included.
async fn under_prefix(resp: Response, prefix: &str) -> Response {
    let html = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/html"));
    if !html {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return refuse(StatusCode::INTERNAL_SERVER_ERROR, "the page could not be read");
    };
    let text = prefixed(&String::from_utf8_lossy(&bytes), prefix);
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(text))
}

/// `html` with every `href`, `action`, `formaction` and `src` that names a path of the
/// console moved under `prefix`; the overview (`/`) is the prefix itself.
fn prefixed(html: &str, prefix: &str) -> String {
    const ATTRS: [&str; 4] = ["href", "action", "formaction", "src"];
    let mut out = String::with_capacity(html.len() + 64 * prefix.len());
    let mut rest = html;
    while let Some(i) = rest.find("=\"/") {
        let (head, tail) = rest.split_at(i + 2);
        out.push_str(head);
        rest = tail;
        if ATTRS.iter().any(|a| head[..i].ends_with(a)) {
            out.push_str(prefix);
            if tail.starts_with("/\"") || tail.starts_with("/?") {
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

async fn check(app: &App, req: Request, next: Next, in_prefix: bool) -> Response {
    let headers = req.headers();
    let host = header_str(headers, &header::HOST).unwrap_or_default().to_owned();
    if let Some(allowed) = &app.opts.allowed_hosts {
        if !host_allowed(allowed, &host) {
            return refuse(
                StatusCode::MISDIRECTED_REQUEST,
                &format!(
                    "this console answers only to {}: the request named the host `{host}`",
                    allowed.join(", ")
                ),
            );
        }
    }
    if let Some(token) = &app.opts.token {
        let bearer = header_str(headers, &header::AUTHORIZATION).and_then(|v| v.strip_prefix("Bearer "));
        let cookie_name = format!("{TOKEN_COOKIE}_{}", app.opts.port);
        // The cookie counts only where a browser sends it (a cookie set at `/` by an older
        // console is refused, not honoured).
        let ok = (in_prefix && cookies(headers, &cookie_name).any(|c| same_secret(c, token)))
            || bearer.is_some_and(|b| same_secret(b.trim(), token));
        if !ok {
            let given = req.uri().query().and_then(|q| {
                form_urlencoded::parse(q.as_bytes())
                    .find(|(k, _)| k == "token")
                    .map(|(_, v)| v.into_owned())
            });
            if req.method() == Method::GET && given.as_deref().is_some_and(|g| same_secret(g, token)) {
                // The printed URL: keep the token in a cookie and drop it from the address bar.
                let rest: String = req
                    .uri()
                    .query()
                    .map(|q| {
                        form_urlencoded::Serializer::new(String::new())
                            .extend_pairs(form_urlencoded::parse(q.as_bytes()).filter(|(k, _)| k != "token"))
                            .finish()
                    })
                    .unwrap_or_default();
                let prefix = app.prefix.as_deref().unwrap_or_default();
                let path = req.uri().path();
                let path = match path.strip_prefix(prefix) {
                    Some(p) if in_prefix => p,
                    _ => path,
                };
                let path = if path == "/" { "" } else { path };
                let to = if rest.is_empty() {
                    format!("{prefix}{path}")
                } else {
                    format!("{prefix}{path}?{rest}")
                };
                let set = format!("{cookie_name}={token}; Path={prefix}; HttpOnly; SameSite=Strict");
                // Drops the host-wide cookie an older console may have set.
                let old = format!("{cookie_name}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict");
                return match (
                    HeaderValue::from_str(&to),
                    HeaderValue::from_str(&set),
                    HeaderValue::from_str(&old),
                ) {
                    (Ok(loc), Ok(set), Ok(old)) => {
                        let mut resp = StatusCode::SEE_OTHER.into_response();
                        let h = resp.headers_mut();
                        h.insert(header::LOCATION, loc);
                        h.append(header::SET_COOKIE, set);
                        h.append(header::SET_COOKIE, old);
                        resp
                    }
                    _ => refuse(StatusCode::BAD_REQUEST, "the address cannot be kept"),
                };
            }
            return refuse(
                StatusCode::UNAUTHORIZED,
                "this console needs its token: open the URL `triage console` printed (…/?token=…), \
                 or send `Authorization: Bearer TOKEN`",
            );
        }
    }
    // Any request another site's page makes, GET too: an `<img src=…/dlq>` on any web page
    // would otherwise have the console read (and hide for a while) the whole DLQ.
    if let Some(site) = header_str(headers, &header::HeaderName::from_static("sec-fetch-site")) {
        if site != "same-origin" && site != "none" {
            return refuse(
                StatusCode::FORBIDDEN,
                &format!("refused: a request from another site (Sec-Fetch-Site: {site})"),
            );
        }
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        if let Some(origin) = header_str(headers, &header::ORIGIN) {
            let ours = format!("http://{host}");
            if !origin.eq_ignore_ascii_case(&ours) {
                return refuse(
                    StatusCode::FORBIDDEN,
                    &format!("refused: a state-changing request from another origin ({origin})"),
                );
            }
        }
    }
    next.run(req).await
}

/// An error page with `status`.
pub(crate) fn refuse(status: StatusCode, message: &str) -> Response {
    let body = html::page(
        "Error",
        &format!(
            "<p class=\"error\" id=\"error\">{}</p><p><a href=\"/\">Back to the overview</a></p>",
            html::esc(message)
        ),
    );
    (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

/// An operator error as a page: its one line, with the status its kind calls for.
pub(crate) fn error_page(e: &OpsError) -> Response {
    let status = match e.kind {
        ErrorKind::Usage => StatusCode::BAD_REQUEST,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Unreachable => StatusCode::BAD_GATEWAY,
        ErrorKind::Unsupported => StatusCode::NOT_IMPLEMENTED,
        ErrorKind::Incomplete | ErrorKind::NotAudited | ErrorKind::Failed => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
    };
    refuse(status, &e.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_servers_answer_to_loopback_names_only() {
        let hosts = ConsoleOptions::hosts_for("127.0.0.1:8080".parse().unwrap()).unwrap();
        assert!(hosts.contains(&"localhost:8080".to_owned()));
        assert!(hosts.contains(&"127.0.0.1:8080".to_owned()));
        assert!(!hosts.iter().any(|h| h.contains("evil")));
        let hosts = ConsoleOptions::hosts_for("10.1.2.3:9000".parse().unwrap()).unwrap();
        assert_eq!(hosts, vec!["10.1.2.3:9000".to_owned()]);
        assert_eq!(ConsoleOptions::hosts_for("0.0.0.0:9000".parse().unwrap()), None);
        let hosts = ConsoleOptions::hosts_for("10.1.2.3:80".parse().unwrap()).unwrap();
        assert!(host_allowed(&hosts, "10.1.2.3"));
        assert!(!host_allowed(&hosts, "localhost:80"));
        let hosts = ConsoleOptions::hosts_for("127.0.0.1:8080".parse().unwrap()).unwrap();
        for ok in ["localhost:9000", "localhost", "[::1]", "[::1]:1", "127.0.0.1"] {
            assert!(host_allowed(&hosts, ok), "{ok}");
        }
        for no in [
            "",
            "evil.example:8080",
            "localhost.evil:8080",
            "[::1]x",
            "localhost:80:80",
            "::1",
        ] {
            assert!(!host_allowed(&hosts, no), "{no}");
        }
    }

    #[test]
    fn pages_under_a_prefix_link_under_it() {
        let page = "<a href=\"/\">o</a><a href=\"/dlq?x=1\">d</a><form action=\"/park\">\
<button formaction=\"/purge\"></button><script src=\"/assets/console.js\"></script>\
<a href=\"/?since=1\">a</a><p title=\"/\">data=\"/x\" href=&quot;/evil&quot;</p>";
        assert_eq!(
            prefixed(page, "/s/p"),
            "<a href=\"/s/p\">o</a><a href=\"/s/p/dlq?x=1\">d</a><form action=\"/s/p/park\">\
<button formaction=\"/s/p/purge\"></button><script src=\"/s/p/assets/console.js\"></script>\
<a href=\"/s/p?since=1\">a</a><p title=\"/\">data=\"/x\" href=&quot;/evil&quot;</p>"
        );
    }

    #[test]
    fn tokens_are_long_and_compared_whole() {
        let t = random_token();
        assert_eq!(t.len(), 32);
        assert!(check_token(&t).is_ok());
        assert!(check_token("short").is_err());
        assert!(check_token("a-long-enough_token.~42").is_ok());
        assert!(check_token("long enough but spaced").is_err());
        assert!(check_token("long-enough;Path=/evil").is_err());
        assert!(same_secret(&t, &t.clone()));
        assert!(!same_secret(&t, &t[..31]));
        assert!(!same_secret("aaaaaaaaaaaaaaaa", "aaaaaaaaaaaaaaab"));
    }
}
