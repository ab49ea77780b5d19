//! The audit trail: one item in the state table per operator action that changes state
//! (`dlq replay`, `dlq purge`, `dlq redrive` start and cancel, `breaker open|close|reset`),
//! and `triage audit`, which lists them newest first.
//!
//! The action is done first and audited after, so the count is what was really done; a
//! failed audit write never undoes or hides the action: it comes back as an
//! [`AuditStatus`] with `written: false`, which the command's report carries and the CLI
//! prints as an error (exit code 7 when nothing else went wrong). Who acted is the caller's
//! identity from STS `GetCallerIdentity`, asked at most once per [`Ctx`] (and its clones);
//! when STS cannot answer, the item is written with the actor `unknown` and the reason.
//!
//! Layout (see `docs/state.md`): `pk = audit#<UTC day, YYYY-MM-DD>`,
//! `sk = <epoch ms, 13 digits>#<16 hex digits>`, so the items of a period are one `Query`
//! per day, newest first, and never a `Scan`.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::output::{Report, Table};
use super::{Ctx, OpsError, OpsResult};
use sqs_triage::clock::now_ms;
use sqs_triage::effects::table::{PK, SK, TTL_ATTRIBUTE};

/// How long an audit item is kept when `TRIAGE_AUDIT_RETENTION` is not set: 400 days, so a
/// yearly review still finds the whole year.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(400 * 86_400);
/// The longest audit retention: 100 years of 365.25 days, as `100y` reads (a longer one would
/// be a typo, and the TTL must stay a time DynamoDB can hold).
pub const MAX_RETENTION: Duration = Duration::from_secs(100 * 31_557_600);
/// The variable that sets the retention (a duration: `400d`, `90d`, `2y`).
pub const RETENTION_VAR: &str = "TRIAGE_AUDIT_RETENTION";
/// Partition key prefix of audit items: `audit#<YYYY-MM-DD>` (UTC).
pub const AUDIT_PK_PREFIX: &str = "audit#";
/// The actor recorded when STS could not say who is calling.
pub const UNKNOWN_ACTOR: &str = "unknown";
/// Exit code of a command whose action was done but whose audit item was not written.
pub const NOT_AUDITED_EXIT: u8 = 7;

const DAY_MS: u64 = 86_400_000;
/// The longest `--since`: ten years, 3,661 queries at most.
const MAX_SINCE: Duration = Duration::from_secs(3660 * 86_400);

/// What an operator did, for [`record`]. The action is a free string (`dlq.replay`,
/// `breaker.open`, `park`, `dlq.edit`…); the rest is optional.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AuditEntry {
    /// What was done, e.g. `dlq.purge`.
    pub action: String,
    /// What it was done to: a queue URL, a job type, a job id.
    pub target: String,
    /// How many messages (or jobs) the action affected, as the command counted them.
    pub count: Option<u64>,
    /// The command's selection flags, as JSON (`{"type": ["a"], "older_than": "1h"}`).
    pub filter: Option<Value>,
    /// Anything else worth keeping: the other flags, the outcome, a failure record.
    pub detail: Option<Value>,
}

impl AuditEntry {
    /// An entry for `action` on `target`.
    pub fn new(action: impl Into<String>, target: impl Into<String>) -> Self {
        Self {
            action: action.into(),
            target: target.into(),
            ..Self::default()
        }
    }

    /// With the count of what was affected.
    pub fn count(mut self, n: u64) -> Self {
        self.count = Some(n);
        self
    }

    /// With the selection flags.
    pub fn filter(mut self, filter: Value) -> Self {
        self.filter = Some(filter);
        self
    }

    /// With other details.
    pub fn detail(mut self, detail: Value) -> Self {
        self.detail = Some(detail);
        self
    }

    /// With `outcome` (`unclear`: the call got no clear answer and may have taken effect;
    /// `not_sent`…) and the error, in the details.
    pub fn outcome(mut self, outcome: &str, error: &str) -> Self {
        let mut d = match self.detail.take() {
            Some(Value::Object(m)) => m,
            Some(other) => Map::from_iter([("detail".to_owned(), other)]),
            None => Map::new(),
        };
        d.insert("outcome".into(), json!(outcome));
        d.insert("error".into(), json!(error));
        self.detail = Some(Value::Object(d));
        self
    }
}

/// Audits an action that failed after it may have changed state, and returns its error naming
/// the item (or saying it was not written).
pub async fn failed_action(ctx: &Ctx, entry: AuditEntry, err: OpsError) -> OpsError {
    let status = record_action(ctx, entry).await;
    error_with_status(err, status.as_ref())
}

/// The caller's identity, as STS answered (asked once per [`Ctx`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Actor {
    /// The caller's ARN, or [`UNKNOWN_ACTOR`].
    pub arn: String,
    /// Why the ARN is unknown.
    pub error: Option<String>,
    /// The caller's account, as STS answered.
    pub account: Option<String>,
    /// Why the ARN STS gave cannot be trusted: an STS endpoint that is not AWS's while the
    /// resources are AWS's, an answer that contradicts itself, or an account that is not the
    /// audit table's.
    pub unverified: Option<String>,
}

/// Whether an action was audited: carried by the action's report (`audit` in its JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[must_use = "an audit failure must be reported, never dropped"]
pub struct AuditStatus {
    /// The item was written.
    pub written: bool,
    /// The state table.
    pub table: String,
    /// The item's id: `<YYYY-MM-DD>/<sort key>` (see `docs/state.md`).
    pub id: String,
    /// When the action was recorded (epoch ms).
    pub at_ms: u64,
    /// Who: the caller's ARN, or `unknown`.
    pub actor: String,
    /// Why the actor is unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor_error: Option<String>,
    /// Why the actor STS named is not verified (see [`Actor::unverified`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor_unverified: Option<String>,
    /// Why the item was not written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl AuditStatus {
    /// One line when the item was not written.
    pub fn problem(&self) -> Option<String> {
        let e = self.error.as_ref()?;
        Some(format!(
            "the action was done, but its audit item was not written to {}: {e}",
            self.table
        ))
    }

    /// One line when the item was written without a known or a verified actor.
    pub fn warning(&self) -> Option<String> {
        if !self.written {
            return None;
        }
        if let Some(e) = &self.actor_error {
            return Some(format!("audited with actor `{UNKNOWN_ACTOR}`: {e}"));
        }
        let why = self.actor_unverified.as_ref()?;
        Some(format!(
            "audited with actor `{}`, not verified: {why}",
            self.actor
        ))
    }
}

/// The audit retention from `TRIAGE_AUDIT_RETENTION` (default [`DEFAULT_RETENTION`]); at
/// least a day. Read before the action, so a bad value refuses the command, not the audit.
pub fn retention_from_env() -> OpsResult<Duration> {
    let Some(v) = std::env::var(RETENTION_VAR).ok().filter(|v| !v.trim().is_empty()) else {
        return Ok(DEFAULT_RETENTION);
    };
    let d = super::parse_duration(&v).map_err(|e| OpsError::usage(format!("{RETENTION_VAR}: {e}")))?;
    if d < Duration::from_secs(86_400) || d > MAX_RETENTION {
        return Err(OpsError::usage(format!(
            "{RETENTION_VAR} must be from 1d to 100y (got {v})"
        )));
    }
    Ok(d)
}

/// Checks that `table` exists, before an audited action that does not otherwise use it
/// (purge, redrive): a missing table refuses the command before anything is changed.
pub async fn check_table(ctx: &Ctx, table: &str) -> OpsResult<()> {
    ctx.ddb_call("DescribeTable", table, || {
        ctx.ddb.describe_table().table_name(table).send()
    })
    .await?;
    Ok(())
}

/// The longest `filter` or `detail` an item stores, in bytes of JSON text: an item stays far
/// below DynamoDB's 400 KB whatever the action carries (a failure record's error text can be
/// close to SQS's 1 MiB, and a forged one is as long as its producer likes).
pub const MAX_JSON_BYTES: usize = 16 * 1024;

/// `v` as JSON text, or, when longer than [`MAX_JSON_BYTES`], a JSON object saying so with the
/// text's first bytes (cut at a character boundary).
fn capped(v: &Value) -> String {
    let text = v.to_string();
    if text.len() <= MAX_JSON_BYTES {
        return text;
    }
    // The prefix is escaped again inside the wrapper (quotes and backslashes double): shrink
    // it until the whole fits.
    let mut room = MAX_JSON_BYTES - 256;
    loop {
        let out = serde_json::json!({
            "truncated_from_bytes": text.len(),
            "prefix": sqs_triage::effects::ledger::truncate(&text, room),
        })
        .to_string();
        if out.len() <= MAX_JSON_BYTES || room == 0 {
            return out;
        }
        room = room.saturating_sub(out.len() - MAX_JSON_BYTES);
    }
}

/// Records `entry` in `table`, now. Never fails: what went wrong is in the status, which the
/// caller puts in its report.
pub async fn record(ctx: &Ctx, table: &str, entry: AuditEntry) -> AuditStatus {
    record_at(ctx, table, entry, now_ms()).await
}

/// Records `entry` in the table the context audits to ([`Ctx::audited`]); `None` when the
/// context does not audit (a library caller that did not ask for it).
pub async fn record_action(ctx: &Ctx, entry: AuditEntry) -> Option<AuditStatus> {
    let table = ctx.audit_table()?.to_owned();
    Some(record(ctx, &table, entry).await)
}

/// [`record`] with the time of the action given (epoch ms): imports, and tests of `--since`.
pub async fn record_at(ctx: &Ctx, table: &str, entry: AuditEntry, at_ms: u64) -> AuditStatus {
    let actor = ctx.actor().await;
    let unverified = actor
        .unverified
        .clone()
        .or_else(|| foreign_queue(actor.account.as_deref(), &entry.target));
    let day = utc_day(at_ms);
    let sk = format!("{at_ms:013}#{:016x}", rand::random::<u64>());
    let expires_at = (at_ms / 1000).saturating_add(ctx.audit_retention().as_secs());
    let s = |v: &str| AttributeValue::S(v.to_owned());
    let n = |v: u64| AttributeValue::N(v.to_string());
    let mut item = HashMap::from([
        (PK.to_owned(), s(&format!("{AUDIT_PK_PREFIX}{day}"))),
        (SK.to_owned(), s(&sk)),
        ("action".to_owned(), s(&entry.action)),
        ("target".to_owned(), s(&entry.target)),
        ("actor".to_owned(), s(&actor.arn)),
        ("at".to_owned(), n(at_ms)),
        (TTL_ATTRIBUTE.to_owned(), n(expires_at)),
    ]);
    if let Some(c) = entry.count {
        item.insert("count".into(), n(c));
    }
    if let Some(f) = &entry.filter {
        item.insert("filter".into(), s(&capped(f)));
    }
    if let Some(d) = &entry.detail {
        item.insert("detail".into(), s(&capped(d)));
    }
    if let Some(e) = &actor.error {
        item.insert("actor_error".into(), s(e));
    }
    if let Some(u) = &unverified {
        item.insert("actor_unverified".into(), s(u));
    }
    if let Some(u) = local_user() {
        item.insert("local_user".into(), s(&u));
    }
    // A new key every time, so no condition: a retried write whose first try landed writes
    // the same item again.
    let put = ctx
        .ddb_call("PutItem", table, || {
            ctx.ddb
                .put_item()
                .table_name(table)
                .set_item(Some(item.clone()))
                .send()
        })
        .await;
    AuditStatus {
        written: put.is_ok(),
        table: table.to_owned(),
        id: format!("{day}/{sk}"),
        at_ms,
        actor: actor.arn,
        actor_error: actor.error,
        actor_unverified: unverified,
        error: put.err().map(|e| e.message),
    }
}

/// Why the caller (of `account`) is not verified for the queue `target` names (its URL's or
/// ARN's account is another), if it is a queue.
fn foreign_queue(account: Option<&str>, target: &str) -> Option<String> {
    let account = account?;
    let theirs = queue_account(target)?;
    (theirs != account).then(|| {
        format!("STS named a caller of account {account}, but the queue {target} is in account {theirs}")
    })
}

/// The account a queue URL (`…/<account>/<name>`) or queue ARN names.
fn queue_account(target: &str) -> Option<&str> {
    let account = if let Some(arn) = target.strip_prefix("arn:") {
        arn.split(':').nth(3)?
    } else {
        let rest = target.split_once("://")?.1;
        let mut parts = rest.split('/');
        parts.next()?;
        let account = parts.next()?;
        parts.next().filter(|n| !n.is_empty())?;
        account
    };
    is_account(account).then_some(account)
}

/// Twelve digits: an AWS account id.
fn is_account(s: &str) -> bool {
    s.len() == 12 && s.bytes().all(|b| b.is_ascii_digit())
}

/// The account of an ARN (`arn:aws:iam::123456789012:user/x`).
fn arn_account(arn: &str) -> Option<&str> {
    arn.split(':').nth(4).filter(|a| is_account(a))
}

/// Why an STS answer (`arn`, `account`) cannot be trusted, before any resource is compared:
/// an STS endpoint that is not AWS's while SQS or DynamoDB are AWS's (anyone can answer
/// there), or an ARN of another account than the one the answer names.
fn untrusted_answer(sts: &str, resources_on_aws: bool, arn: &str, account: Option<&str>) -> Option<String> {
    if resources_on_aws && !is_aws_endpoint(sts) {
        return Some(format!(
            "STS answered at {sts}, which is not AWS, while SQS or DynamoDB are AWS's"
        ));
    }
    match (arn_account(arn), account) {
        (Some(a), Some(b)) if a == b => None,
        _ => Some(format!(
            "STS's answer names the account {} and the ARN {arn}",
            account.unwrap_or("-")
        )),
    }
}

/// The local login name (`USER`/`USERNAME`): self-reported context next to the STS identity
/// (useful when a team shares one role), never a substitute for it.
fn local_user() -> Option<String> {
    ["USER", "USERNAME"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
}

/// An error of an action that was partly done, with what became of its audit item.
pub fn error_with_status(err: OpsError, status: Option<&AuditStatus>) -> OpsError {
    match status {
        Some(s) if s.written => {
            OpsError::new(err.kind, format!("{err} (what was done is audited as {})", s.id))
        }
        Some(s) => OpsError::new(
            err.kind,
            format!(
                "{err}; what was done was not audited: {}",
                s.error.as_deref().unwrap_or("-")
            ),
        ),
        None => err,
    }
}

/// The selection flags of a DLQ command, as JSON, named as the flags are: only those given,
/// plus `max_scan`.
pub fn filter_json(filter: &super::dlq::Filter, limit: Option<usize>, max_scan: usize) -> Value {
    let mut m = Map::new();
    let dur = |d: Duration| Value::String(humantime::format_duration(d).to_string());
    if !filter.job_types.is_empty() {
        m.insert("type".into(), json!(filter.job_types));
    }
    if !filter.classes.is_empty() {
        m.insert("class".into(), json!(filter.classes));
    }
    if let Some(e) = &filter.error_contains {
        m.insert("error".into(), json!(e));
    }
    if let Some(d) = filter.older_than {
        m.insert("older_than".into(), dur(d));
    }
    if let Some(d) = filter.newer_than {
        m.insert("newer_than".into(), dur(d));
    }
    if !filter.ids.is_empty() {
        m.insert("id".into(), json!(filter.ids));
    }
    if let Some(l) = limit {
        m.insert("limit".into(), json!(l));
    }
    m.insert("max_scan".into(), json!(max_scan));
    Value::Object(m)
}

/// The caller's identity from STS, for [`Ctx::actor`]. Against a local emulator (an endpoint
/// variable pointing SQS or DynamoDB away from AWS), STS is only asked when it has an
/// endpoint of its own (`AWS_ENDPOINT_URL_STS` or `AWS_ENDPOINT_URL`): a local set-up never
/// sends its credentials to AWS's STS.
pub(crate) async fn caller_identity(ctx: &Ctx) -> Actor {
    let mut actor = sts_identity(ctx).await;
    if actor.error.is_some() || actor.unverified.is_some() {
        return actor;
    }
    // The audit table's account, from its ARN, when DynamoDB is AWS's (DynamoDB Local's ARNs
    // name no real account).
    let Some(table) = ctx.audit_table().filter(|_| is_aws_endpoint(&ctx.ddb_endpoint)) else {
        return actor;
    };
    let described = ctx
        .ddb_call("DescribeTable", table, || {
            ctx.ddb.describe_table().table_name(table).send()
        })
        .await;
    let arn = described.map(|d| d.table.and_then(|t| t.table_arn).unwrap_or_default());
    actor.unverified = match (&arn, actor.account.as_deref()) {
        (Ok(arn), Some(caller)) => match arn_account(arn) {
            Some(theirs) if theirs == caller => None,
            Some(theirs) => Some(format!(
                "STS named a caller of account {caller}, but the table {table} is in account {theirs}"
            )),
            None => Some(format!(
                "the table {table} has no ARN to check the caller's account against"
            )),
        },
        (Ok(_), None) => Some("STS named no account".into()),
        (Err(e), _) => Some(format!("the table's account could not be read: {e}")),
    };
    actor
}

/// The caller's identity as STS answers it, with whether that answer can be trusted at all.
async fn sts_identity(ctx: &Ctx) -> Actor {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let sts_endpoint = env("AWS_ENDPOINT_URL_STS").or_else(|| env("AWS_ENDPOINT_URL"));
    let local = [&ctx.sqs_endpoint, &ctx.ddb_endpoint]
        .iter()
        .any(|e| !is_aws_endpoint(e));
    if sts_endpoint.is_none() && local {
        return Actor {
            arn: UNKNOWN_ACTOR.into(),
            error: Some(
                "STS has no endpoint while SQS or DynamoDB use a local one: set AWS_ENDPOINT_URL_STS \
                 (moto answers STS at its SQS endpoint)"
                    .into(),
            ),
            ..Actor::default()
        };
    }
    let resources_on_aws = [&ctx.sqs_endpoint, &ctx.ddb_endpoint]
        .iter()
        .any(|e| is_aws_endpoint(e));
    let sts = sts_endpoint.unwrap_or_else(|| "sts.amazonaws.com".into());
    let out = ctx
        .storage_retry()
        .call("GetCallerIdentity", None, || ctx.sts.get_caller_identity().send())
        .await;
    match out {
        Ok(o) => match o.arn {
            Some(arn) if !arn.is_empty() => Actor {
                unverified: untrusted_answer(&sts, resources_on_aws, &arn, o.account.as_deref()),
                account: o.account,
                arn,
                error: None,
            },
            _ => Actor {
                arn: UNKNOWN_ACTOR.into(),
                error: Some("STS GetCallerIdentity answered without an ARN".into()),
                ..Actor::default()
            },
        },
        Err(e) => Actor {
            arn: UNKNOWN_ACTOR.into(),
            error: Some(format!("STS GetCallerIdentity failed: {e}")),
            ..Actor::default()
        },
    }
}

/// An STS client with the SDK's retries disabled (the storage retry policy is the only one)
/// and connect and per-call timeouts set.
pub(crate) fn sts_client(conf: &aws_config::SdkConfig) -> aws_sdk_sts::Client {
    use sqs_triage::effects::storage_retry::{CONNECT_TIMEOUT, DYNAMODB_ATTEMPT_TIMEOUT};
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .operation_attempt_timeout(DYNAMODB_ATTEMPT_TIMEOUT)
        .build();
    let conf = aws_sdk_sts::config::Builder::from(conf)
        .retry_config(aws_config::retry::RetryConfig::disabled())
        .timeout_config(timeouts)
        .build();
    aws_sdk_sts::Client::from_conf(conf)
}

/// True for an endpoint on AWS (`*.amazonaws.com`, `*.amazonaws.com.cn`, or no URL at all).
fn is_aws_endpoint(endpoint: &str) -> bool {
    let host = endpoint
        .strip_prefix("https://")
        .or_else(|| endpoint.strip_prefix("http://"))
        .unwrap_or(endpoint)
        .split(['/', ':'])
        .next()
        .unwrap_or_default();
    host.ends_with(".amazonaws.com") || host.ends_with(".amazonaws.com.cn") || host.ends_with(".api.aws")
}

/// `YYYY-MM-DD` of an epoch-ms instant, in UTC.
pub fn utc_day(at_ms: u64) -> String {
    let days = (at_ms / DAY_MS) as i64;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// One audit item, as `triage audit` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditRecord {
    /// `<YYYY-MM-DD>/<sort key>`.
    pub id: String,
    /// When (epoch ms).
    pub at_ms: u64,
    /// When, as RFC 3339 (UTC).
    pub at: String,
    /// Who: the caller's ARN, or `unknown`.
    pub actor: String,
    /// Why the actor is unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor_error: Option<String>,
    /// Why the actor STS named was not verified.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor_unverified: Option<String>,
    /// The local login name of whoever ran the command (self-reported).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_user: Option<String>,
    /// What was done.
    pub action: String,
    /// What it was done to.
    pub target: String,
    /// How many.
    pub count: Option<u64>,
    /// The selection flags.
    pub filter: Option<Value>,
    /// Other details.
    pub detail: Option<Value>,
}

impl AuditRecord {
    fn from_item(item: &HashMap<String, AttributeValue>) -> Option<Self> {
        let s = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
        let n = |k: &str| {
            item.get(k)
                .and_then(|v| v.as_n().ok())
                .and_then(|v| v.parse::<u64>().ok())
        };
        let json = |k: &str| s(k).map(|t| serde_json::from_str::<Value>(&t).unwrap_or(Value::String(t)));
        let day = s(PK)?.strip_prefix(AUDIT_PK_PREFIX)?.to_owned();
        let sk = s(SK)?;
        let at_ms = n("at").or_else(|| sk.split('#').next().and_then(|t| t.parse().ok()))?;
        Some(Self {
            id: format!("{day}/{sk}"),
            at_ms,
            at: sqs_triage::clock::rfc3339_millis(at_ms),
            actor: s("actor").unwrap_or_else(|| UNKNOWN_ACTOR.into()),
            actor_error: s("actor_error"),
            actor_unverified: s("actor_unverified"),
            local_user: s("local_user"),
            action: s("action").unwrap_or_default(),
            target: s("target").unwrap_or_default(),
            count: n("count"),
            filter: json("filter"),
            detail: json("detail"),
        })
    }
}

/// What `triage audit` lists.
#[derive(Debug, Clone, Serialize)]
pub struct AuditReport {
    /// The state table.
    pub table: String,
    /// Items at or after this instant (epoch ms).
    pub since_ms: u64,
    /// Only this action (and its sub-actions: `dlq.redrive` lists `dlq.redrive.start`).
    pub action: Option<String>,
    /// At most this many items.
    pub limit: usize,
    /// More items matched than the limit let through.
    pub truncated: bool,
    /// The items, newest first.
    pub entries: Vec<AuditRecord>,
}

impl Report for AuditReport {
    fn human(&self) -> String {
        if self.entries.is_empty() {
            return format!(
                "no audit items in {} since {}\n",
                self.table,
                sqs_triage::clock::rfc3339_seconds(self.since_ms)
            );
        }
        let mut t = Table::new(["AT", "ACTOR", "ACTION", "TARGET", "COUNT", "FILTER"]).max_width(80);
        for e in &self.entries {
            let actor = match &e.actor_unverified {
                Some(_) => format!("{} (unverified)", e.actor),
                None => e.actor.clone(),
            };
            t.row([
                sqs_triage::clock::rfc3339_seconds(e.at_ms),
                actor,
                e.action.clone(),
                e.target.clone(),
                e.count.map_or_else(|| "-".into(), |c| c.to_string()),
                e.filter.as_ref().map_or_else(|| "-".into(), Value::to_string),
            ]);
        }
        let mut out = t.render();
        if self.truncated {
            out.push_str(&format!(
                "(the {} newest shown: pass --limit or a shorter --since for the rest)\n",
                self.limit
            ));
        }
        out
    }
}

/// `triage audit [--since D] [--action A] [--limit N]`: the items of the last `since`, newest
/// first: one `Query` per UTC day (newest day first), stopping once `limit` items are found.
/// `action` matches an action and its sub-actions (`dlq.redrive` → `dlq.redrive.cancel`).
pub async fn list(
    ctx: &Ctx,
    table: &str,
    since: Duration,
    action: Option<&str>,
    limit: usize,
) -> OpsResult<AuditReport> {
    if limit == 0 {
        return Err(OpsError::usage("--limit must be at least 1"));
    }
    // One query per day: a typo like `--since 1000y` must not become 365,000 queries.
    if since > MAX_SINCE {
        return Err(OpsError::usage(
            "--since is at most 3660d (ten years): audit items are kept for TRIAGE_AUDIT_RETENTION (default 400d)",
        ));
    }
    let now = now_ms();
    let since_ms = now.saturating_sub(since.as_millis().min(u128::from(u64::MAX)) as u64);
    let from = format!("{since_ms:013}");
    let mut entries = Vec::new();
    let mut truncated = false;
    let mut day = now / DAY_MS;
    'days: loop {
        let pk = format!("{AUDIT_PK_PREFIX}{}", utc_day(day * DAY_MS));
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let out = ctx
                .ddb_call("Query", table, || {
                    let mut q = ctx
                        .ddb
                        .query()
                        .table_name(table)
                        .key_condition_expression("#pk = :pk AND #sk >= :from")
                        .expression_attribute_names("#pk", PK)
                        .expression_attribute_names("#sk", SK)
                        .expression_attribute_values(":pk", AttributeValue::S(pk.clone()))
                        .expression_attribute_values(":from", AttributeValue::S(from.clone()))
                        .scan_index_forward(false)
                        .consistent_read(true)
                        .set_exclusive_start_key(start.clone());
                    if let Some(a) = action {
                        q = q
                            .filter_expression("#a = :a OR begins_with(#a, :ap)")
                            .expression_attribute_names("#a", "action")
                            .expression_attribute_values(":a", AttributeValue::S(a.to_owned()))
                            .expression_attribute_values(":ap", AttributeValue::S(format!("{a}.")));
                    }
                    q.send()
                })
                .await?;
            for item in out.items.unwrap_or_default() {
                if let Some(r) = AuditRecord::from_item(&item) {
                    if entries.len() == limit {
                        truncated = true;
                        break 'days;
                    }
                    entries.push(r);
                }
            }
            match out.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => break,
            }
        }
        if day <= since_ms / DAY_MS {
            break;
        }
        day -= 1;
    }
    Ok(AuditReport {
        table: table.to_owned(),
        since_ms,
        action: action.map(str::to_owned),
        limit,
        truncated,
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capped_value_fits_whatever_its_escaping() {
        for v in [
            serde_json::json!({"e": "\"".repeat(40_000)}),
            serde_json::json!({"e": "\\".repeat(40_000)}),
            serde_json::json!({"e": "é".repeat(40_000)}),
        ] {
            let out = capped(&v);
            assert!(out.len() <= MAX_JSON_BYTES, "{}", out.len());
            let back: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(back["truncated_from_bytes"], v.to_string().len());
        }
        let small = serde_json::json!({"a": 1});
        assert_eq!(capped(&small), small.to_string());
    }

    #[test]
    fn a_hundred_years_is_the_longest_retention() {
        let read = |v: &str| super::super::parse_duration(v).unwrap();
        assert!(read("100y") <= MAX_RETENTION);
        assert!(read("36500d") <= MAX_RETENTION);
        assert!(read("101y") > MAX_RETENTION);
    }

    #[test]
    fn days_are_utc_calendar_days() {
        assert_eq!(utc_day(0), "1970-01-01");
        assert_eq!(utc_day(DAY_MS - 1), "1970-01-01");
        assert_eq!(utc_day(DAY_MS), "1970-01-02");
        // 2024-02-29T23:59:59.999Z and the next millisecond.
        assert_eq!(utc_day(1_709_251_199_999), "2024-02-29");
        assert_eq!(utc_day(1_709_251_200_000), "2024-03-01");
        assert_eq!(utc_day(1_798_761_600_000), "2027-01-01");
    }

    #[test]
    fn sort_keys_order_as_time() {
        let a = format!("{:013}#{:016x}", 999_999_999_999u64, u64::MAX);
        let b = format!("{:013}#{:016x}", 1_000_000_000_000u64, 0u64);
        assert!(a < b);
    }

    #[test]
    fn aws_endpoints_are_told_from_local_ones() {
        assert!(is_aws_endpoint("sqs.us-east-1.amazonaws.com"));
        assert!(is_aws_endpoint("https://vpce-1.sqs.us-east-1.vpce.amazonaws.com"));
        assert!(is_aws_endpoint("https://sqs.cn-north-1.amazonaws.com.cn/"));
        assert!(!is_aws_endpoint("http://127.0.0.1:45660"));
        assert!(!is_aws_endpoint("http://localhost:4566"));
        assert!(!is_aws_endpoint("http://amazonaws.com.evil:80"));
    }

    #[test]
    fn an_sts_answer_is_trusted_only_from_aws_and_for_the_resources_account() {
        let arn = "arn:aws:iam::111111111111:user/op";
        let aws = "https://sts.us-east-1.amazonaws.com";
        assert_eq!(untrusted_answer(aws, true, arn, Some("111111111111")), None);
        assert_eq!(
            untrusted_answer("sts.amazonaws.com", true, arn, Some("111111111111")),
            None
        );
        // Anyone can answer at another endpoint while the resources are AWS's.
        let why = untrusted_answer("http://10.0.0.9:8080", true, arn, Some("111111111111")).unwrap();
        assert!(why.contains("not AWS"), "{why}");
        // A local stack: its own STS is as good as its queues.
        assert_eq!(
            untrusted_answer("http://127.0.0.1:45660", false, arn, Some("111111111111")),
            None
        );
        assert!(untrusted_answer(aws, true, arn, Some("222222222222")).is_some());
        assert!(untrusted_answer(aws, true, arn, None).is_some());
        // A queue of another account than the caller's.
        let q = "https://sqs.us-east-1.amazonaws.com/222222222222/jobs-dlq";
        assert_eq!(queue_account(q), Some("222222222222"));
        assert_eq!(
            queue_account("arn:aws:sqs:us-east-1:333333333333:jobs"),
            Some("333333333333")
        );
        assert_eq!(queue_account("billing.charge"), None);
        assert_eq!(
            queue_account("http://127.0.0.1:45660/123456789012/q"),
            Some("123456789012")
        );
        assert!(
            foreign_queue(Some("111111111111"), q)
                .unwrap()
                .contains("222222222222")
        );
        assert_eq!(foreign_queue(Some("222222222222"), q), None);
        assert_eq!(foreign_queue(Some("111111111111"), "billing.charge"), None);
    }

    #[test]
    fn filters_keep_the_flag_names() {
        let f = super::super::dlq::Filter {
            job_types: vec!["a".into()],
            older_than: Some(Duration::from_secs(3600)),
            ..Default::default()
        };
        assert_eq!(
            filter_json(&f, Some(5), 100),
            json!({"type": ["a"], "older_than": "1h", "limit": 5, "max_scan": 100})
        );
    }
}
