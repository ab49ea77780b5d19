//! The console's pages and actions. Reads go through the same functions as `dlq list`,
//! `dlq show`, `breaker status`, `attempts show` and `audit`; every action shows a
//! confirmation page with a dry-run preview (GET, changes nothing), and is done by a POST
//! carrying the CSRF token, through the same function as the CLI's command.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{FromRequest, Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;

use super::html::{self, esc, hidden, q};
use super::{App, error_page, refuse, same_secret};
use crate::ops::breaker::{self, BreakerView, Force};
use crate::ops::dlq::read::{ReadEnd, read_to_end};
use crate::ops::dlq::{self, DlqMessage, Filter, ShowReport};
use crate::ops::output::Report;
use crate::ops::{OpsError, OpsResult, audit, park, parse_duration};
use sqs_triage::clock::{now_ms, rfc3339_seconds};

type AppState = State<Arc<App>>;

pub(super) fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/", get(overview))
        .route("/api/overview", get(overview_json))
        .route("/dlq", get(dlq_page))
        .route("/dlq/group", get(group_page))
        .route("/dlq/message/{id}", get(message_page))
        .route(
            "/replay",
            get(replay_confirm).post(|s, b| detached(replay_do(s, b))),
        )
        .route("/purge", get(purge_confirm).post(|s, b| detached(purge_do(s, b))))
        .route("/edit", post(|s, b| detached(edit_do(s, b))))
        .route("/edit/preview", post(edit_preview))
        .route("/park", get(park_form).post(|s, b| detached(park_do(s, b))))
        .route("/park/confirm", get(park_confirm))
        .route(
            "/breaker",
            get(breaker_confirm).post(|s, b| detached(breaker_do(s, b))),
        )
        .route("/audit", get(audit_page))
}

/// Runs a state-changing action as a task of its own and awaits it: when the client goes
/// away, axum drops the request's future, and the action must not stop halfway (messages
/// held, the audit item unwritten) because a tab was closed.
async fn detached(action: impl Future<Output = Response> + Send + 'static) -> Response {
    match tokio::spawn(action).await {
        Ok(r) => r,
        Err(e) => refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("the action stopped unexpectedly ({e}): check the DLQ and the audit trail"),
        ),
    }
}

/// The largest request body the console takes: a 1 MiB message body URL-encoded (up to three
/// bytes per byte) or tens of thousands of message ids, with room to spare.
pub(super) const MAX_BODY: usize = 16 << 20;

/// A form's body; a body the console cannot take gets its error page.
pub(super) struct FormBody(String);

impl<S: Send + Sync> FromRequest<S> for FormBody {
    type Rejection = Response;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, Response> {
        String::from_request(req, state).await.map(FormBody).map_err(|e| {
            let status = e.status();
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                refuse(
                    status,
                    &format!(
                        "the request is larger than the console takes ({} MiB): nothing was changed; \
                         choose fewer messages, or use the CLI",
                        MAX_BODY >> 20
                    ),
                )
            } else {
                refuse(status, &format!("the request cannot be read: {}", e.body_text()))
            }
        })
    }
}

/// Query or form parameters, repeated keys kept in order.
struct Params(Vec<(String, String)>);

impl Params {
    fn parse(s: &str) -> Self {
        Self(form_urlencoded::parse(s.as_bytes()).into_owned().collect())
    }
    fn query(raw: Option<String>) -> Self {
        Self::parse(raw.as_deref().unwrap_or_default())
    }
    /// The first non-empty value of `k`, trimmed.
    fn get(&self, k: &str) -> Option<&str> {
        self.0
            .iter()
            .filter(|(key, _)| key == k)
            .map(|(_, v)| v.trim())
            .find(|v| !v.is_empty())
    }
    /// Every non-empty value of `k`.
    fn all(&self, k: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(key, v)| key == k && !v.trim().is_empty())
            .map(|(_, v)| v.trim().to_owned())
            .collect()
    }
    /// The raw first value of `k` (not trimmed: an edited body is kept byte for byte).
    fn raw(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str())
    }
}

fn html_ok(title: &str, body: &str) -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        html::page(title, body),
    )
        .into_response()
}

/// The refusal of a form without this process's CSRF token, if it has none.
fn csrf_refusal(app: &App, p: &Params) -> Option<Response> {
    match p.raw("csrf") {
        Some(t) if same_secret(t, &app.csrf) => None,
        _ => Some(refuse(
            StatusCode::FORBIDDEN,
            "refused: the form carried no valid CSRF token (reload the page and confirm again)",
        )),
    }
}

/// A selection of DLQ messages, as `dlq list` filters them (plus `error_is`: a group's exact
/// error text, and `id`: chosen messages).
#[derive(Debug, Clone, Default)]
struct Selection {
    filter: Filter,
    error_is: Option<String>,
    max_scan: usize,
}

impl Selection {
    fn from(p: &Params, default_scan: usize) -> OpsResult<Self> {
        let dur = |k: &str| {
            p.get(k)
                .map(|v| parse_duration(v).map_err(|e| OpsError::usage(format!("{k}: {e}"))))
                .transpose()
        };
        let max_scan = match p.get("max_scan") {
            None => default_scan,
            Some(v) => {
                let n = v.parse::<usize>().ok().filter(|n| *n > 0).ok_or_else(|| {
                    OpsError::usage(format!("max_scan: `{v}` is not a positive whole number"))
                })?;
                if n > default_scan {
                    return Err(OpsError::usage(format!(
                        "max_scan: {n} is more than this console's --max-scan ({default_scan})"
                    )));
                }
                n
            }
        };
        let filter = Filter {
            job_types: p.all("type"),
            classes: p.all("class"),
            error_contains: p.get("error").map(str::to_owned),
            older_than: dur("older_than")?,
            newer_than: dur("newer_than")?,
            ids: p.all("id"),
        };
        filter.validate()?;
        Ok(Self {
            filter,
            error_is: p.raw("error_is").filter(|e| !e.is_empty()).map(str::to_owned),
            max_scan,
        })
    }

    fn matches(&self, m: &DlqMessage, now: u64) -> bool {
        self.filter.matches(m, now) && self.error_is.as_ref().is_none_or(|e| *e == m.error())
    }

    /// The query string that gives this selection again.
    fn query(&self) -> String {
        let f = &self.filter;
        let mut pairs: Vec<(&str, String)> = Vec::new();
        pairs.extend(f.job_types.iter().map(|t| ("type", t.clone())));
        pairs.extend(f.classes.iter().map(|c| ("class", c.clone())));
        if let Some(e) = &f.error_contains {
            pairs.push(("error", e.clone()));
        }
        if let Some(d) = f.older_than {
            pairs.push(("older_than", format!("{}s", d.as_secs())));
        }
        if let Some(d) = f.newer_than {
            pairs.push(("newer_than", format!("{}s", d.as_secs())));
        }
        pairs.extend(f.ids.iter().map(|i| ("id", i.clone())));
        if let Some(e) = &self.error_is {
            pairs.push(("error_is", e.clone()));
        }
        html::query(pairs.iter().map(|(k, v)| (*k, v.as_str())))
    }

    /// The DLQ's messages this selection takes, read as `dlq list` reads them, and the note
    /// on what the read left out ([`read_note`]).
    async fn read(&self, app: &App) -> OpsResult<(Vec<DlqMessage>, String)> {
        let now = now_ms();
        let (all, end) = read_to_end(&app.ctx, &app.opts.dlq_url, self.max_scan).await?;
        let note = read_note(end, all.len());
        Ok((all.into_iter().filter(|m| self.matches(m, now)).collect(), note))
    }
}

/// What a page built from a read of the DLQ says when the read may have left messages out
/// (stopped at `--max-scan`, or cut short), as `dlq list` says it; else nothing. Counts,
/// groups and selections on such a page cover the messages read only.
fn read_note(end: ReadEnd, read: usize) -> String {
    match end.note(read) {
        Some(n) => format!("<p class=\"warning\" id=\"read-note\">Note: {}.</p>", esc(&n)),
        None => String::new(),
    }
}

/// [`read_note`] for the read behind a `dlq show` report.
fn show_note(r: &ShowReport) -> String {
    let end = if r.incomplete {
        ReadEnd::CutShort
    } else if r.scan_limit_reached {
        ReadEnd::ScanLimit
    } else {
        ReadEnd::Complete
    };
    read_note(end, r.scanned)
}

impl Selection {}

/// One queue's counts.
#[derive(Debug, Clone, Copy, Default, Serialize)]
struct Depth {
    visible: u64,
    in_flight: u64,
    delayed: u64,
}

async fn depth(app: &App, url: &str, var: &str) -> OpsResult<Depth> {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let ctx = &app.ctx;
    let out = ctx
        .sqs_call("GetQueueAttributes", Some((url, var)), || {
            ctx.sqs
                .get_queue_attributes()
                .queue_url(url)
                .attribute_names(A::ApproximateNumberOfMessages)
                .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
                .attribute_names(A::ApproximateNumberOfMessagesDelayed)
                .send()
        })
        .await?;
    let attrs = out.attributes.unwrap_or_default();
    let get = |k: A| attrs.get(&k).and_then(|v| v.parse().ok()).unwrap_or(0);
    Ok(Depth {
        visible: get(A::ApproximateNumberOfMessages),
        in_flight: get(A::ApproximateNumberOfMessagesNotVisible),
        delayed: get(A::ApproximateNumberOfMessagesDelayed),
    })
}

/// What the overview polls.
#[derive(Debug, Clone, Serialize)]
struct Overview {
    source: Depth,
    dlq: Depth,
    breakers: Vec<BreakerView>,
    at_ms: u64,
}

async fn overview_data(app: &App) -> OpsResult<Overview> {
    let (source, dlq, breakers) = tokio::try_join!(
        depth(app, &app.opts.queue_url, "TRIAGE_QUEUE_URL"),
        depth(app, &app.opts.dlq_url, "TRIAGE_DLQ_URL"),
        breaker::status(&app.ctx, &app.opts.table, None),
    )?;
    Ok(Overview {
        source,
        dlq,
        breakers: breakers.breakers,
        at_ms: now_ms(),
    })
}

async fn overview_json(State(app): AppState) -> Response {
    match overview_data(&app).await {
        Ok(o) => json(StatusCode::OK, &o),
        Err(e) => json(
            error_page(&e).status(),
            &serde_json::json!({ "error": e.message }),
        ),
    }
}

fn json<T: Serialize>(status: StatusCode, v: &T) -> Response {
    let body =
        serde_json::to_string(v).unwrap_or_else(|e| format!("{{\"error\":\"cannot serialize: {e}\"}}"));
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn depth_rows(prefix: &str, d: &Depth) -> Vec<Vec<String>> {
    [
        ("visible", d.visible),
        ("in flight", d.in_flight),
        ("delayed", d.delayed),
    ]
    .iter()
    .map(|(label, n)| {
        let field = format!("{prefix}.{}", label.replace(' ', "_"));
        vec![
            esc(label),
            format!(
                "<span class=\"num\" id=\"{}\" data-field=\"{}\">{n}</span>",
                esc(&field.replace('.', "-")),
                esc(&field)
            ),
        ]
    })
    .collect()
}

fn open_until(b: &BreakerView) -> String {
    match (b.forced, b.open_until_ms) {
        (true, _) => "until an operator closes it".into(),
        (false, Some(t)) => rfc3339_seconds(t),
        (false, None) => "-".into(),
    }
}

fn breaker_rows(breakers: &[BreakerView]) -> Vec<Vec<String>> {
    breakers
        .iter()
        .map(|b| {
            let t = esc(&b.job_type);
            let link = |what: &str| {
                format!(
                    "<a href=\"/breaker?{}\">{what}…</a>",
                    esc(&html::query([("type", b.job_type.as_str()), ("action", what)]))
                )
            };
            vec![
                t.clone(),
                format!(
                    "<span class=\"phase\" data-breaker=\"{t}\" data-part=\"phase\">{}</span>",
                    esc(&b.phase)
                ),
                format!(
                    "<span data-breaker=\"{t}\" data-part=\"failures\">{}</span> of \
                     <span data-breaker=\"{t}\" data-part=\"executions\">{}</span>",
                    b.failures, b.executions
                ),
                format!(
                    "<span data-breaker=\"{t}\" data-part=\"open_until\">{}</span>",
                    esc(&open_until(b))
                ),
                format!("{} {} {}", link("open"), link("close"), link("reset")),
            ]
        })
        .collect()
}

async fn overview(State(app): AppState) -> Response {
    let data = match overview_data(&app).await {
        Ok(d) => d,
        Err(e) => return error_page(&e),
    };
    // The oldest DLQ failure and the chart come from one read of the DLQ, on page load only
    // (the live refresh asks for counts and breakers, which hold no message).
    let (all, end) = match read_to_end(&app.ctx, &app.opts.dlq_url, app.opts.max_scan).await {
        Ok(a) => a,
        Err(e) => return error_page(&e),
    };
    let note = read_note(end, all.len());
    let now = now_ms();
    let oldest = all.iter().map(|m| m.failed_at_ms()).min();
    let mut b = String::new();
    let _ = write!(
        b,
        "<p class=\"live\">Counts and breakers refresh every 5 s while this tab is shown (last: <span id=\"refreshed\">{}</span>).</p>\
<section><h2>Source queue</h2><p class=\"url\">{}</p>{}\
<p id=\"oldest-note\">Age of the oldest message: SQS does not tell it (CloudWatch's \
<code>ApproximateAgeOfOldestMessage</code> does, and the console does not read CloudWatch). \
Oldest DLQ failure instead: <strong id=\"oldest-dlq-failure\">{}</strong>.</p></section>",
        esc(&rfc3339_seconds(data.at_ms)),
        esc(&app.opts.queue_url),
        html::table(
            "source-depth",
            &["messages", "count"],
            &depth_rows("source", &data.source)
        ),
        match oldest {
            Some(t) => esc(&format!(
                "{} ({} ago)",
                rfc3339_seconds(t),
                html::age(now.saturating_sub(t) / 1000)
            )),
            None => "none (the DLQ is empty)".into(),
        }
    );
    let _ = write!(
        b,
        "<section><h2>Dead-letter queue</h2><p class=\"url\">{}</p>{}{note}<p><a href=\"/dlq\">Open the DLQ, grouped</a></p>{}</section>",
        esc(&app.opts.dlq_url),
        html::table("dlq-depth", &["messages", "count"], &depth_rows("dlq", &data.dlq)),
        html::arrivals_chart(
            &all.iter()
                .map(|m| (m.job_type.clone(), m.failed_at_ms()))
                .collect::<Vec<_>>(),
            now,
            24
        )
    );
    let _ = write!(
        b,
        "<section><h2>Circuit breakers</h2><p class=\"url\">table {}</p>{}{}\
<form method=\"get\" action=\"/breaker\" class=\"inline\"><label>Job type <input name=\"type\" required></label> \
<select name=\"action\"><option>open</option><option>close</option><option>reset</option></select> \
<button>Force…</button></form></section>",
        esc(&app.opts.table),
        if data.breakers.is_empty() {
            "<p id=\"no-breakers\">No breaker has stored state: every job type's is closed.</p>".to_owned()
        } else {
            String::new()
        },
        if data.breakers.is_empty() {
            String::new()
        } else {
            html::table(
                "breakers",
                &[
                    "job type",
                    "phase",
                    "failed of ran in window",
                    "open until",
                    "force",
                ],
                &breaker_rows(&data.breakers),
            )
        },
    );
    html_ok("Overview", &b)
}

/// DLQ messages of one job type, failure class and error text.
struct Group<'a> {
    job_type: &'a str,
    class: &'a str,
    error: String,
    messages: Vec<&'a DlqMessage>,
}

fn groups(messages: &[DlqMessage]) -> Vec<Group<'_>> {
    let mut by: BTreeMap<(&str, &str, String), Vec<&DlqMessage>> = BTreeMap::new();
    for m in messages {
        by.entry((m.job_type.as_str(), m.class(), m.error()))
            .or_default()
            .push(m);
    }
    let mut out: Vec<Group> = by
        .into_iter()
        .map(|((job_type, class, error), messages)| Group {
            job_type,
            class,
            error,
            messages,
        })
        .collect();
    out.sort_by(|a, b| {
        b.messages
            .len()
            .cmp(&a.messages.len())
            .then_with(|| a.job_type.cmp(b.job_type))
    });
    out
}

fn filter_form(p: &Params) -> String {
    let v = |k: &str| esc(p.get(k).unwrap_or_default());
    let class = p.get("class").unwrap_or_default();
    let mut options = String::from("<option value=\"\">any</option>");
    for c in [
        "fatal",
        "exhausted",
        "invalid",
        "expiring",
        "parked",
        "unrecorded",
    ] {
        let sel = if c == class { " selected" } else { "" };
        let _ = write!(options, "<option{sel}>{c}</option>");
    }
    format!(
        "<form method=\"get\" action=\"/dlq\" class=\"filters\">\
<label>Job type <input name=\"type\" value=\"{}\"></label> \
<label>Class <select name=\"class\">{options}</select></label> \
<label>Error contains <input name=\"error\" value=\"{}\"></label> \
<label>Older than <input name=\"older_than\" value=\"{}\" placeholder=\"30m\" size=\"5\"></label> \
<label>Newer than <input name=\"newer_than\" value=\"{}\" placeholder=\"2h\" size=\"5\"></label> \
<label>Id <input name=\"id\" value=\"{}\"></label> <button>Filter</button></form>",
        v("type"),
        v("error"),
        v("older_than"),
        v("newer_than"),
        v("id"),
    )
}

/// The query's parameters, the selection they make, the DLQ messages it takes (read as
/// `dlq list` reads them) and the read's note; the error page when the query or the read fails.
async fn selected(app: &App, raw: Option<String>) -> Result<Selected, Response> {
    let p = Params::query(raw);
    let sel = Selection::from(&p, app.opts.max_scan).map_err(|e| error_page(&e))?;
    let (messages, note) = sel.read(app).await.map_err(|e| error_page(&e))?;
    Ok((p, sel, messages, note))
}

type Selected = (Params, Selection, Vec<DlqMessage>, String);

async fn dlq_page(State(app): AppState, RawQuery(raw): RawQuery) -> Response {
    let (p, sel, messages, note) = match selected(&app, raw).await {
        Ok(x) => x,
        Err(page) => return page,
    };
    let now = now_ms();
    let gs = groups(&messages);
    let rows: Vec<Vec<String>> = gs
        .iter()
        .map(|g| {
            let mut gsel = sel.clone();
            gsel.filter.job_types = vec![g.job_type.to_owned()];
            gsel.filter.classes = vec![g.class.to_owned()];
            gsel.error_is = Some(g.error.clone());
            let ages = g.messages.iter().map(|m| now.saturating_sub(m.failed_at_ms()) / 1000);
            let query = gsel.query();
            vec![
                esc(g.job_type),
                esc(g.class),
                format!("<span class=\"error-text\">{}</span>", esc(&g.error)),
                format!("<span class=\"num\">{}</span>", g.messages.len()),
                html::age(ages.clone().max().unwrap_or(0)),
                html::age(ages.min().unwrap_or(0)),
                format!(
                    "<a class=\"open-group\" href=\"/dlq/group?{q}\">open</a> · <a href=\"/replay?{q}\">replay…</a> · <a href=\"/purge?{q}\">purge…</a>",
                    q = esc(&query)
                ),
            ]
        })
        .collect();
    let mut b = filter_form(&p);
    let _ = write!(
        b,
        "<p id=\"dlq-total\">{} message(s) in {} group(s) in {}.</p>{note}",
        messages.len(),
        gs.len(),
        esc(&app.opts.dlq_url)
    );
    if !gs.is_empty() {
        let q = esc(&sel.query());
        let _ = write!(
            b,
            "{}<p><a href=\"/replay?{q}\">Replay everything shown…</a> · <a href=\"/purge?{q}\">Purge everything shown…</a></p>",
            html::table(
                "groups",
                &["job type", "class", "error", "count", "oldest", "newest", ""],
                &rows
            )
        );
    }
    b.push_str(&html::arrivals_chart(
        &messages
            .iter()
            .map(|m| (m.job_type.clone(), m.failed_at_ms()))
            .collect::<Vec<_>>(),
        now,
        24,
    ));
    html_ok("Dead-letter queue", &b)
}

fn message_rows(messages: &[&DlqMessage], now: u64, checkboxes: bool) -> Vec<Vec<String>> {
    messages
        .iter()
        .map(|m| {
            let mut row = Vec::new();
            if checkboxes {
                row.push(format!(
                    "<input type=\"checkbox\" name=\"id\" value=\"{}\" checked>",
                    esc(&m.message_id)
                ));
            }
            row.extend([
                format!(
                    "<a class=\"message-link\" href=\"/dlq/message/{}\">{}</a>",
                    esc(&q(&m.message_id)),
                    esc(&m.job_id)
                ),
                esc(&m.job_type),
                esc(m.class()),
                m.record.as_ref().map_or("-".into(), |r| r.attempts.to_string()),
                html::age(now.saturating_sub(m.failed_at_ms()) / 1000),
                format!("<span class=\"error-text\">{}</span>", esc(&m.error())),
            ]);
            row
        })
        .collect()
}

async fn group_page(State(app): AppState, RawQuery(raw): RawQuery) -> Response {
    let (_, sel, messages, note) = match selected(&app, raw).await {
        Ok(x) => x,
        Err(page) => return page,
    };
    let now = now_ms();
    let refs: Vec<&DlqMessage> = messages.iter().collect();
    let title = format!(
        "{} × {}",
        sel.filter.job_types.join(", "),
        sel.filter.classes.join(", ")
    );
    let mut b = String::new();
    if let Some(e) = &sel.error_is {
        let _ = write!(
            b,
            "<p>Error: <span class=\"error-text\" id=\"group-error\">{}</span></p>",
            esc(e)
        );
    }
    let _ = write!(
        b,
        "<p id=\"group-count\">{} message(s).</p>{note}",
        messages.len()
    );
    let q = esc(&sel.query());
    let _ = write!(
        b,
        "<p><a id=\"replay-group\" href=\"/replay?{q}\">Replay this group…</a> · <a id=\"purge-group\" href=\"/purge?{q}\">Purge this group…</a></p>\
<form method=\"get\" action=\"/replay\">{}<p><button>Replay the checked messages…</button> \
<button formaction=\"/purge\">Purge the checked messages…</button></p></form>",
        html::table(
            "messages",
            &["", "job id", "job type", "class", "attempts", "age", "error"],
            &message_rows(&refs, now, true)
        )
    );
    html_ok(&format!("DLQ group {title}"), &b)
}

async fn message_page(State(app): AppState, Path(id): Path<String>) -> Response {
    let report = match dlq::show(&app.ctx, &app.opts.dlq_url, &id, app.opts.max_scan).await {
        Ok(r) => r,
        Err(e) => return error_page(&e),
    };
    let mut b = show_note(&report);
    for m in &report.messages {
        let s = &m.summary;
        let mut rows = vec![
            vec!["message id".into(), esc(&s.message_id)],
            vec!["job id".into(), esc(&s.job_id)],
            vec!["job type".into(), esc(&s.job_type)],
            vec!["class".into(), esc(&s.class)],
            vec![
                "attempts".into(),
                s.attempts.map_or("-".into(), |a| a.to_string()),
            ],
            vec!["age".into(), html::age(s.age_s)],
            vec![
                "error".into(),
                format!("<span class=\"error-text\">{}</span>", esc(&s.error)),
            ],
            vec![
                "source queue".into(),
                esc(s.source_queue.as_deref().unwrap_or("-")),
            ],
            vec!["entered the DLQ".into(), esc(&rfc3339_seconds(m.dlq_sent_at))],
        ];
        if let Some(r) = &m.record {
            rows.push(vec!["original message".into(), esc(&r.original_message_id)]);
        }
        let record = m
            .record
            .as_ref()
            .and_then(|r| serde_json::to_string_pretty(r).ok())
            .unwrap_or_else(|| "no failure record".into());
        let attrs: Vec<Vec<String>> = m.attributes.iter().map(|(k, v)| vec![esc(k), esc(v)]).collect();
        let qid = esc(&html::query([("id", s.message_id.as_str())]));
        let _ = write!(
            b,
            "<section class=\"message\">{}<h2>Failure record</h2>{}<h2>Body</h2>{}<h2>Attributes</h2>{}\
<h2>Actions</h2><p><a href=\"/replay?{qid}\">Replay this message…</a> · <a href=\"/purge?{qid}\">Purge this message…</a></p>\
<h3>Edit and replay</h3><form method=\"post\" action=\"/edit/preview\">{}{}\
<textarea name=\"body\" rows=\"12\" cols=\"100\" spellcheck=\"false\">\n{}</textarea>\
<p><button>Preview the edit…</button></p></form></section>",
            html::table("message-fields", &["field", "value"], &rows),
            html::pre("failure-record", &record),
            html::pre("message-body", &html::pretty_body(&m.body)),
            if attrs.is_empty() {
                "<p>none</p>".to_owned()
            } else {
                html::table("attributes", &["name", "value"], &attrs)
            },
            hidden("csrf", &app.csrf),
            hidden("id", &s.message_id),
            esc(&m.body),
        );
    }
    html_ok(&format!("DLQ message {}", report.id), &b)
}

/// The report of an action as a page: a headline, what went wrong if anything, the audit
/// item, and the report as the CLI prints it.
fn report_page<R: Report>(title: &str, headline: &str, r: &R) -> Response {
    report_page_with(title, headline, None, r)
}

/// [`report_page`] with a problem the console found besides the report's own.
fn report_page_with<R: Report>(title: &str, headline: &str, problem: Option<String>, r: &R) -> Response {
    let mut b = format!("<p id=\"result\" class=\"result\">{}</p>", esc(headline));
    let problems: Vec<String> = problem.into_iter().chain(r.problem()).collect();
    if !problems.is_empty() {
        let _ = write!(
            b,
            "<p class=\"error\" id=\"problem\">{}</p>",
            esc(&problems.join("; "))
        );
    }
    match r.audit() {
        Some(a) if a.written => {
            let _ = write!(
                b,
                "<p id=\"audited\">Recorded in the audit trail as {} by {}.</p>",
                esc(&a.id),
                esc(&a.actor)
            );
            if let Some(w) = a.warning() {
                let _ = write!(b, "<p class=\"error\" id=\"audit-warning\">{}</p>", esc(&w));
            }
        }
        Some(a) => {
            let _ = write!(
                b,
                "<p class=\"error\" id=\"audited\">{}</p>",
                esc(&a.problem().unwrap_or_default())
            );
        }
        None => {}
    }
    b.push_str(&html::pre("report", &r.human()));
    b.push_str(
        "<p><a href=\"/\">Overview</a> · <a href=\"/dlq\">DLQ</a> · <a href=\"/audit\">Audit trail</a></p>",
    );
    html_ok(title, &b)
}

fn selection_form(app: &App, action: &str, messages: &[DlqMessage], extra: &str, button: &str) -> String {
    let mut f = format!(
        "<form method=\"post\" action=\"{}\" class=\"confirm\">{}",
        esc(action),
        hidden("csrf", &app.csrf)
    );
    for m in messages {
        f.push_str(&hidden("id", &m.message_id));
    }
    f.push_str(&hidden("expected", &messages.len().to_string()));
    let _ = write!(
        f,
        "{extra}<p><button id=\"confirm\">{}</button> <a href=\"/dlq\">Cancel</a></p></form>",
        esc(button)
    );
    f
}

async fn replay_confirm(State(app): AppState, RawQuery(raw): RawQuery) -> Response {
    let (p, _, messages, note) = match selected(&app, raw).await {
        Ok(x) => x,
        Err(page) => return page,
    };
    if messages.is_empty() {
        return refuse(StatusCode::NOT_FOUND, &nothing_selected("replay", &note));
    }
    // The dry run of exactly these messages, as `dlq replay --dry-run --id …` shows it.
    let opts = replay_options(&app, ids(&messages), None, true);
    let preview = match dlq::replay(&app.ctx, &app.opts.dlq_url, &opts).await {
        Ok(r) => r,
        Err(e) => return error_page(&e),
    };
    let refs: Vec<&DlqMessage> = messages.iter().collect();
    let rate = p.get("rate").unwrap_or_default();
    let mut b = format!(
        "<p id=\"plan\">Replay <strong>{}</strong> message(s) to their source queue with a fresh attempt ledger, \
then delete them from the DLQ. Nothing moves until you confirm.</p>{note}{}<h2>Dry run</h2>{}",
        messages.len(),
        html::table(
            "selected",
            &["job id", "job type", "class", "attempts", "age", "error"],
            &message_rows(&refs, now_ms(), false)
        ),
        html::pre("dry-run", &preview.human())
    );
    let extra = format!(
        "<p><label>At most <input name=\"rate\" value=\"{}\" size=\"6\" placeholder=\"no limit\"> messages per second</label></p>",
        esc(rate)
    );
    b.push_str(&selection_form(
        &app,
        "/replay",
        &messages,
        &extra,
        &format!("Replay {} message(s)", messages.len()),
    ));
    html_ok("Confirm the replay", &b)
}

/// The refusal of a selection that took no message, naming what the read left out.
fn nothing_selected(action: &str, note: &str) -> String {
    let mut why = format!("no DLQ message matches this selection: nothing to {action}");
    if !note.is_empty() {
        why.push_str(" (among the messages read: the read did not reach the end of the DLQ)");
    }
    why
}

fn ids(messages: &[DlqMessage]) -> Vec<String> {
    messages.iter().map(|m| m.message_id.clone()).collect()
}

fn replay_options(app: &App, ids: Vec<String>, rate: Option<f64>, dry_run: bool) -> dlq::ReplayOptions {
    dlq::ReplayOptions {
        filter: Filter {
            ids,
            ..Filter::default()
        },
        to: None,
        limit: None,
        rate,
        dry_run,
        table: Some(app.opts.table.clone()),
        progress: false,
        max_scan: app.opts.max_scan,
        stop: None,
        hold: None,
    }
}

/// The chosen message ids of a confirmed form, and how many the confirmation showed.
fn chosen(p: &Params) -> Result<(Vec<String>, usize), &'static str> {
    let ids = p.all("id");
    if ids.is_empty() {
        return Err("no message was chosen: nothing was changed");
    }
    let expected = p
        .get("expected")
        .and_then(|e| e.parse::<usize>().ok())
        .unwrap_or(ids.len());
    Ok((ids, expected))
}

async fn replay_do(State(app): AppState, FormBody(body): FormBody) -> Response {
    let p = Params::parse(&body);
    if let Some(r) = csrf_refusal(&app, &p) {
        return r;
    }
    let (ids, _) = match chosen(&p) {
        Ok(c) => c,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, e),
    };
    let rate = match p.get("rate").map(|r| r.parse::<f64>()) {
        None => None,
        Some(Ok(r)) => Some(r),
        Some(Err(_)) => {
            return error_page(&OpsError::usage(format!(
                "rate: `{}` is not a number of messages per second",
                p.get("rate").unwrap_or_default()
            )));
        }
    };
    let n = ids.len();
    match dlq::replay(
        &app.ctx,
        &app.opts.dlq_url,
        &replay_options(&app, ids.clone(), rate, false),
    )
    .await
    {
        Ok(r) => {
            // Confirmed messages the replay did not move: gone from the DLQ since the
            // confirmation (another operator), or not sent (the report says why).
            let missed: Vec<&str> = ids
                .iter()
                .filter(|i| r.moved_ids.binary_search(i).is_err())
                .map(String::as_str)
                .collect();
            let problem = (!missed.is_empty()).then(|| {
                format!(
                    "{} of the {n} confirmed message(s) were not moved: {}",
                    missed.len(),
                    missed.join(", ")
                )
            });
            report_page_with(
                "Replayed",
                &format!("Replayed {} of the {n} confirmed message(s).", r.moved),
                problem,
                &r,
            )
        }
        Err(e) => error_page(&e),
    }
}

async fn purge_confirm(State(app): AppState, RawQuery(raw): RawQuery) -> Response {
    let (_, _, messages, note) = match selected(&app, raw).await {
        Ok(x) => x,
        Err(page) => return page,
    };
    if messages.is_empty() {
        return refuse(StatusCode::NOT_FOUND, &nothing_selected("purge", &note));
    }
    let refs: Vec<&DlqMessage> = messages.iter().collect();
    let mut b = format!(
        "<p id=\"plan\" class=\"warning\">Delete <strong>{}</strong> message(s) from the DLQ. This cannot be undone. \
Nothing is deleted until you confirm; if the DLQ no longer holds exactly these, nothing is deleted.</p>{note}{}",
        messages.len(),
        html::table(
            "selected",
            &["job id", "job type", "class", "attempts", "age", "error"],
            &message_rows(&refs, now_ms(), false)
        ),
    );
    b.push_str(&selection_form(
        &app,
        "/purge",
        &messages,
        "",
        &format!("Delete {} message(s)", messages.len()),
    ));
    html_ok("Confirm the purge", &b)
}

async fn purge_do(State(app): AppState, FormBody(body): FormBody) -> Response {
    let p = Params::parse(&body);
    if let Some(r) = csrf_refusal(&app, &p) {
        return r;
    }
    let (ids, expected) = match chosen(&p) {
        Ok(c) => c,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, e),
    };
    let filter = Filter {
        ids,
        ..Filter::default()
    };
    let mut found = None;
    let r = dlq::purge(
        &app.ctx,
        &app.opts.dlq_url,
        &filter,
        None,
        app.opts.max_scan,
        |plan| {
            found = Some(plan.selected);
            plan.selected == expected
        },
    )
    .await;
    match r {
        // Every confirmed message is gone: the library asks no confirmation of an empty
        // selection, but the operator confirmed some.
        Ok(r) if r.plan.selected == 0 => refuse(
            StatusCode::CONFLICT,
            &format!(
                "nothing was deleted: {expected} message(s) were confirmed but the DLQ now holds 0 of them; review the selection again"
            ),
        ),
        Ok(r) => report_page(
            "Purged",
            &format!("Deleted {} of the {expected} confirmed message(s).", r.deleted),
            &r,
        ),
        Err(_) if found.is_some_and(|f| f != expected) => refuse(
            StatusCode::CONFLICT,
            &format!(
                "nothing was deleted: {expected} message(s) were confirmed but the DLQ now holds {} of them; review the selection again",
                found.unwrap_or_default()
            ),
        ),
        Err(e) => error_page(&e),
    }
}

async fn edit_preview(State(app): AppState, FormBody(body): FormBody) -> Response {
    let p = Params::parse(&body);
    if let Some(r) = csrf_refusal(&app, &p) {
        return r;
    }
    let Some(id) = p.get("id") else {
        return refuse(StatusCode::BAD_REQUEST, "no message id: nothing was changed");
    };
    let report = match dlq::show(&app.ctx, &app.opts.dlq_url, id, app.opts.max_scan).await {
        Ok(r) => r,
        Err(e) => return error_page(&e),
    };
    let [m] = report.messages.as_slice() else {
        return refuse(
            StatusCode::BAD_REQUEST,
            &format!(
                "`{id}` names {} DLQ messages: edit one by its message id",
                report.messages.len()
            ),
        );
    };
    // Browsers submit a textarea's line breaks as CRLF: a body that had none gets its LFs back.
    let lf = !m.body.contains('\r');
    let new_body = &submitted_body(&p, lf);
    let changed = m.body != *new_body;
    let json_note = match serde_json::from_str::<serde_json::Value>(new_body) {
        Ok(_) => "The new body is valid JSON.".to_owned(),
        Err(e) => format!("The new body is not valid JSON ({e}); it is sent as it is."),
    };
    let mut b = format!(
        "<p id=\"plan\">Send the edited body to <strong>{}</strong> with a fresh attempt ledger, then delete the original \
from the DLQ. {} {}</p><h2>Now</h2>{}<h2>Edited</h2>{}",
        esc(m.summary.source_queue.as_deref().unwrap_or("its source queue")),
        if changed {
            "The body changed."
        } else {
            "The body is unchanged: confirm to replay it as it is."
        },
        esc(&json_note),
        html::pre("body-now", &html::pretty_body(&m.body)),
        html::pre("body-edited", &html::pretty_body(new_body)),
    );
    let _ = write!(
        b,
        "<form method=\"post\" action=\"/edit\" class=\"confirm\">{}{}{}{}{}\
<p><button id=\"confirm\">Replay the edited message</button> <a href=\"/dlq/message/{}\">Cancel</a></p></form>",
        hidden("csrf", &app.csrf),
        hidden("id", &m.summary.message_id),
        hidden("body", new_body),
        if lf { hidden("lf", "1") } else { String::new() },
        if changed {
            String::new()
        } else {
            hidden("force", "1")
        },
        esc(&q(&m.summary.message_id)),
    );
    html_ok("Confirm the edit", &b)
}

/// The body a form submitted, byte for byte but for line breaks: with `lf` (the original body
/// had no CR), the CRLFs a browser sends for every line break become LFs again.
fn submitted_body(p: &Params, lf: bool) -> String {
    let raw = p.raw("body").unwrap_or_default();
    if lf {
        raw.replace("\r\n", "\n")
    } else {
        raw.to_owned()
    }
}

async fn edit_do(State(app): AppState, FormBody(body): FormBody) -> Response {
    let p = Params::parse(&body);
    if let Some(r) = csrf_refusal(&app, &p) {
        return r;
    }
    let Some(id) = p.get("id") else {
        return refuse(StatusCode::BAD_REQUEST, "no message id: nothing was changed");
    };
    let opts = dlq::EditOptions {
        table: Some(app.opts.table.clone()),
        force: p.get("force").is_some(),
        max_scan: app.opts.max_scan,
        ..dlq::EditOptions::new(
            id,
            dlq::EditSource::Body(submitted_body(&p, p.get("lf").is_some())),
        )
    };
    match dlq::edit(&app.ctx, &app.opts.dlq_url, &opts).await {
        Ok(r) => report_page(
            "Edited and replayed",
            &format!("Sent the edited body as message {}.", r.new_message_id),
            &r,
        ),
        Err(e) => error_page(&e),
    }
}

async fn park_form(State(_app): AppState) -> Response {
    html_ok(
        "Park a job",
        "<p>Move a job that waits for its next retry to the DLQ now (class <code>parked</code>), without running it again.</p>\
<form method=\"get\" action=\"/park/confirm\"><p><label>Job id <input name=\"job_id\" required></label></p>\
<p><label>Job type <input name=\"type\" placeholder=\"needed when several types share the id\"></label></p>\
<p><label>Reason <input name=\"reason\" size=\"60\"></label></p><p><button>Preview…</button></p></form>",
    )
}

async fn park_confirm(State(app): AppState, RawQuery(raw): RawQuery) -> Response {
    let p = Params::query(raw);
    let Some(job_id) = p.get("job_id") else {
        return refuse(StatusCode::BAD_REQUEST, "no job id: give the job id to park");
    };
    let job_type = p.get("type");
    let ledger = match breaker::attempts(&app.ctx, &app.opts.table, job_type, job_id).await {
        Ok(r) => r,
        Err(e) => return error_page(&e),
    };
    if !ledger.found {
        return refuse(
            StatusCode::NOT_FOUND,
            &format!(
                "job {job_id} has no attempt ledger in {}: nothing to park",
                app.opts.table
            ),
        );
    }
    let mut b = format!(
        "<p id=\"plan\">Park job <strong>{}</strong> of type <strong>{}</strong>: its next retry is not run; it goes to the DLQ \
as <code>parked</code> with the {} attempt(s) it used. Nothing changes until you confirm.</p><h2>Its attempt ledger now</h2>{}",
        esc(job_id),
        esc(ledger.job_type.as_deref().unwrap_or("-")),
        ledger.attempts,
        html::pre("ledger", &ledger.human()),
    );
    let _ = write!(
        b,
        "<form method=\"post\" action=\"/park\" class=\"confirm\">{}{}{}{}<p><button id=\"confirm\">Park the job</button> <a href=\"/\">Cancel</a></p></form>",
        hidden("csrf", &app.csrf),
        hidden("job_id", job_id),
        hidden(
            "type",
            ledger.job_type.as_deref().or(job_type).unwrap_or_default()
        ),
        hidden("reason", p.get("reason").unwrap_or_default()),
    );
    html_ok("Confirm the park", &b)
}

async fn park_do(State(app): AppState, FormBody(body): FormBody) -> Response {
    let p = Params::parse(&body);
    if let Some(r) = csrf_refusal(&app, &p) {
        return r;
    }
    let Some(job_id) = p.get("job_id") else {
        return refuse(StatusCode::BAD_REQUEST, "no job id: nothing was changed");
    };
    let opts = park::ParkOptions {
        job_id: job_id.to_owned(),
        job_type: p.get("type").map(str::to_owned),
        by: app.opts.local_user.clone(),
        reason: p.get("reason").map(str::to_owned),
    };
    match park::park(&app.ctx, &app.opts.table, &opts).await {
        Ok(r) => report_page("Parked", &format!("Parked job {}.", r.job_id), &r),
        Err(e) => error_page(&e),
    }
}

fn force_of(p: &Params) -> OpsResult<(String, Force)> {
    let job_type = p
        .get("type")
        .ok_or_else(|| OpsError::usage("no job type: name the breaker's job type"))?;
    let what = match p.get("action") {
        Some("open") => Force::Open(
            p.get("for")
                .map(|v| parse_duration(v).map_err(|e| OpsError::usage(format!("for: {e}"))))
                .transpose()?,
        ),
        Some("close") => Force::Close,
        Some("reset") => Force::Reset,
        other => {
            return Err(OpsError::usage(format!(
                "action: `{}` is not open, close or reset",
                other.unwrap_or_default()
            )));
        }
    };
    Ok((job_type.to_owned(), what))
}

async fn breaker_confirm(State(app): AppState, RawQuery(raw): RawQuery) -> Response {
    let p = Params::query(raw);
    let (job_type, what) = match force_of(&p) {
        Ok(f) => f,
        Err(e) => return error_page(&e),
    };
    let now = match breaker::status(&app.ctx, &app.opts.table, Some(&job_type)).await {
        Ok(r) => r,
        Err(e) => return error_page(&e),
    };
    let effect = match what {
        Force::Open(None) => {
            "open until an operator closes it: every consumer defers this job type's messages".to_owned()
        }
        Force::Open(Some(d)) => format!(
            "open for {}, then half-open as usual: every consumer defers this job type's messages meanwhile",
            humantime::format_duration(d)
        ),
        Force::Close => {
            "closed: consumers run this job type again (in-flight probes become stale)".to_owned()
        }
        Force::Reset => "reset to a fresh closed breaker (failure counts cleared)".to_owned(),
    };
    let mut b = format!(
        "<p id=\"plan\">Force the breaker of <strong>{}</strong> {}, for every consumer: it becomes {}. \
Nothing changes until you confirm.</p><h2>Now</h2>{}",
        esc(&job_type),
        esc(what.name()),
        esc(&effect),
        html::table(
            "breakers",
            &[
                "job type",
                "phase",
                "failed of ran in window",
                "open until",
                "force"
            ],
            &breaker_rows(&now.breakers)
        ),
    );
    let open_for = if let Force::Open(Some(_)) = what {
        hidden("for", p.get("for").unwrap_or_default())
    } else if let Force::Open(None) = what {
        "<p><label>For <input name=\"for\" size=\"6\" placeholder=\"until closed\"> (e.g. 10m)</label></p>"
            .to_owned()
    } else {
        String::new()
    };
    let _ = write!(
        b,
        "<form method=\"post\" action=\"/breaker\" class=\"confirm\">{}{}{}{open_for}\
<p><button id=\"confirm\">Force it {}</button> <a href=\"/\">Cancel</a></p></form>",
        hidden("csrf", &app.csrf),
        hidden("type", &job_type),
        hidden("action", what.name()),
        esc(what.name()),
    );
    html_ok("Confirm the breaker force", &b)
}

async fn breaker_do(State(app): AppState, FormBody(body): FormBody) -> Response {
    let p = Params::parse(&body);
    if let Some(r) = csrf_refusal(&app, &p) {
        return r;
    }
    let (job_type, what) = match force_of(&p) {
        Ok(f) => f,
        Err(e) => return error_page(&e),
    };
    match breaker::force(&app.ctx, &app.opts.table, &job_type, what).await {
        Ok(r) => {
            let phase = r.breakers.first().map(|b| b.phase.clone()).unwrap_or_default();
            report_page(
                "Breaker forced",
                &format!("The breaker of {job_type} is now {phase}."),
                &r,
            )
        }
        Err(e) => error_page(&e),
    }
}

async fn audit_page(State(app): AppState, RawQuery(raw): RawQuery) -> Response {
    let p = Params::query(raw);
    let since = match p.get("since").map(parse_duration).transpose() {
        Ok(s) => s.unwrap_or(Duration::from_secs(86_400)),
        Err(e) => return error_page(&OpsError::usage(format!("since: {e}"))),
    };
    match audit::list(&app.ctx, &app.opts.table, since, p.get("action"), 200).await {
        Ok(r) => {
            let rows: Vec<Vec<String>> = r
                .entries
                .iter()
                .map(|e| {
                    // An actor STS named in another account than the resources' is marked,
                    // with why on hover, as the CLI marks it.
                    let actor = match &e.actor_unverified {
                        Some(why) => format!(
                            "{} <span class=\"unverified\" title=\"{}\">(unverified)</span>",
                            esc(&e.actor),
                            esc(why)
                        ),
                        None => esc(&e.actor),
                    };
                    vec![
                        esc(&e.at),
                        actor,
                        esc(&e.action),
                        esc(&e.target),
                        e.count.map_or("-".into(), |c| c.to_string()),
                    ]
                })
                .collect();
            html_ok(
                "Audit trail",
                &format!(
                    "<p>The last {} of actions in {}, newest first.</p>{}",
                    esc(&humantime::format_duration(since).to_string()),
                    esc(&app.opts.table),
                    html::table("audit", &["at", "actor", "action", "target", "count"], &rows)
                ),
            )
        }
        Err(e) => error_page(&e),
    }
}
