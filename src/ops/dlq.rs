//! The DLQ, seen by an operator: list, show, replay, purge, and SQS's own redrive.
//!
//! Reading a queue means receiving from it, so every read holds the messages it saw
//! invisible while it reads (that is how it sees the next ones) and makes them visible again
//! before it returns. Replay sends first and deletes after: a crash in between leaves a
//! duplicate, never a loss.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName};
use serde::Serialize;

use super::output::{Report, Table, progress};
use super::{Ctx, ErrorKind, OpsError, OpsResult, is_fifo, queue_arn, resolve_queue};
use crate::clock::now_ms;
use crate::core::envelope::{self, EnvelopeLimits, JOB_ID_ATTRIBUTE, JOB_TYPE_ATTRIBUTE, Job};
use crate::core::failure::FailureRecord;
use crate::effects::dlq::{failure_record, original_attributes};
use crate::effects::sqs::{Outgoing, Sqs, batches};
use crate::effects::storage_retry::{StorageError, StorageRetry, StorageRetryConfig};

/// Class shown for DLQ messages without a failure record: SQS moved them itself after
/// `maxReceiveCount` receives (a consumer that crashed or timed out on them, a Lambda record
/// that could not be read, or a last-receive copy the DLQ refused), or the processor's copy
/// had no room for a record beside a body at the size limit (its error is then in the job's
/// ledger: `triage attempts show`).
pub const UNRECORDED: &str = "unrecorded";
/// Receives in a row that bring back only messages already seen before a sweep stops.
const STALE_ROUNDS: u32 = 3;

/// One DLQ message as read.
#[derive(Debug, Clone)]
pub struct DlqMessage {
    /// The DLQ message id.
    pub message_id: String,
    /// The receipt handle of the latest receive.
    pub receipt_handle: String,
    /// The body, byte for byte as the producer sent it.
    pub body: String,
    /// The message attributes as they are in the DLQ (record included).
    pub attributes: HashMap<String, MessageAttributeValue>,
    /// The failure record, if the message carries a readable one.
    pub record: Option<FailureRecord>,
    /// When the message entered the DLQ (epoch ms, SQS's SentTimestamp).
    pub sent_at_ms: u64,
    /// The FIFO message group, on FIFO DLQs.
    pub group_id: Option<String>,
}

impl DlqMessage {
    fn from_sdk(m: aws_sdk_sqs::types::Message) -> Option<Self> {
        let attributes = m.message_attributes.unwrap_or_default();
        let system = m.attributes.unwrap_or_default();
        let record = failure_record(&attributes).and_then(Result::ok);
        Some(Self {
            message_id: m.message_id?,
            receipt_handle: m.receipt_handle?,
            body: m.body.unwrap_or_default(),
            record,
            sent_at_ms: system
                .get(&MessageSystemAttributeName::SentTimestamp)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            group_id: system.get(&MessageSystemAttributeName::MessageGroupId).cloned(),
            attributes,
        })
    }

    /// The job type: from the record, else the `job-type` attribute, else the envelope.
    pub fn job_type(&self) -> String {
        if let Some(t) = self.record.as_ref().and_then(|r| r.job_type.clone()) {
            return t;
        }
        let attr = self
            .attributes
            .get(JOB_TYPE_ATTRIBUTE)
            .and_then(|v| v.string_value());
        if let Some(t) = attr {
            return t.to_owned();
        }
        envelope::parse(&self.body, None, None, EnvelopeLimits::default())
            .map(|j| j.job_type)
            .unwrap_or_else(|_| "-".into())
    }

    /// The failure class (`fatal`, `exhausted`, `invalid`, or `unrecorded`).
    pub fn class(&self) -> &'static str {
        self.record.as_ref().map_or(UNRECORDED, |r| r.class.as_str())
    }

    /// The job id: from the record, else the envelope, else the DLQ message id.
    pub fn job_id(&self) -> String {
        if let Some(r) = &self.record {
            return r.job_id.clone();
        }
        envelope::parse(&self.body, None, None, EnvelopeLimits::default())
            .ok()
            .and_then(|j| j.id)
            .unwrap_or_else(|| self.message_id.clone())
    }

    /// The error text, or a note for messages SQS moved itself.
    pub fn error(&self) -> String {
        match &self.record {
            Some(r) => r.error.clone(),
            None => {
                "no failure record: moved by SQS after maxReceiveCount, or no record fitted beside the body (see `triage attempts show`)".into()
            }
        }
    }

    /// When it failed (epoch ms): the record's `failed_at`, else when it entered the DLQ.
    pub fn failed_at_ms(&self) -> u64 {
        self.record.as_ref().map_or(self.sent_at_ms, |r| r.failed_at)
    }

    /// The job as the processor reads it: the body with the `job-type` / `job-id` attributes
    /// among the original ones. This, not the failure record (a producer can forge one),
    /// says which job a replay sends back.
    pub fn body_job(&self) -> Option<Job> {
        let attrs = original_attributes(&self.attributes).ok()?;
        let attr = |name: &str| attrs.get(name).and_then(|v| v.string_value());
        envelope::parse(
            &self.body,
            attr(JOB_TYPE_ATTRIBUTE),
            attr(JOB_ID_ATTRIBUTE),
            EnvelopeLimits::default(),
        )
        .ok()
    }

    /// Why the failure record does not describe this message's body, if it does not: the
    /// processor writes the job type and id it read from the body (the original message id
    /// for a job without an id), so a record naming another job was not written by it.
    pub fn record_mismatch(&self) -> Option<String> {
        let r = self.record.as_ref()?;
        let (body_type, body_id) = match self.body_job() {
            Some(j) => (
                Some(j.job_type),
                j.id.unwrap_or_else(|| r.original_message_id.clone()),
            ),
            None => (None, r.original_message_id.clone()),
        };
        if r.job_type == body_type && r.job_id == body_id {
            return None;
        }
        let show = |t: &Option<String>| t.clone().unwrap_or_else(|| "-".into());
        Some(format!(
            "the failure record names job `{}` of type `{}` but the body is job `{}` of type `{}`",
            r.job_id,
            show(&r.job_type),
            body_id,
            show(&body_type)
        ))
    }
}

/// Which DLQ messages an action applies to. Empty criteria match everything.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Job types (any of).
    pub job_types: Vec<String>,
    /// Failure classes (any of): `fatal`, `exhausted`, `invalid`, `unrecorded`.
    pub classes: Vec<String>,
    /// Substring of the error text (case-insensitive).
    pub error_contains: Option<String>,
    /// Failed at least this long ago.
    pub older_than: Option<Duration>,
    /// Failed at most this long ago.
    pub newer_than: Option<Duration>,
    /// Job ids or message ids (any of).
    pub ids: Vec<String>,
}

impl Filter {
    /// Checks the class names.
    pub fn validate(&self) -> OpsResult<()> {
        for c in &self.classes {
            if !["fatal", "exhausted", "invalid", "expiring", UNRECORDED].contains(&c.as_str()) {
                return Err(OpsError::usage(format!(
                    "unknown failure class `{c}`: use fatal, exhausted, invalid, expiring or {UNRECORDED}"
                )));
            }
        }
        Ok(())
    }

    /// True when the message matches every given criterion.
    pub fn matches(&self, m: &DlqMessage, now_ms: u64) -> bool {
        let age = Duration::from_millis(now_ms.saturating_sub(m.failed_at_ms()));
        (self.job_types.is_empty() || self.job_types.contains(&m.job_type()))
            && (self.classes.is_empty() || self.classes.iter().any(|c| c == m.class()))
            && self
                .error_contains
                .as_ref()
                .is_none_or(|needle| m.error().to_lowercase().contains(&needle.to_lowercase()))
            && self.older_than.is_none_or(|d| age >= d)
            && self.newer_than.is_none_or(|d| age <= d)
            && (self.ids.is_empty()
                || self.ids.iter().any(|id| {
                    *id == m.message_id
                        || *id == m.job_id()
                        || m.record.as_ref().is_some_and(|r| r.original_message_id == *id)
                }))
    }
}

/// Receives every message of a queue once, holding each invisible for `visibility`.
struct Sweep<'a> {
    ctx: &'a Ctx,
    url: &'a str,
    visibility: i32,
    seen: HashSet<String>,
    stale_rounds: u32,
    max: usize,
    done: bool,
}

impl<'a> Sweep<'a> {
    fn new(ctx: &'a Ctx, url: &'a str, visibility: Duration, max: usize) -> Self {
        Self {
            ctx,
            url,
            visibility: visibility.as_secs().clamp(1, 43_200) as i32,
            seen: HashSet::new(),
            stale_rounds: 0,
            max,
            done: false,
        }
    }

    /// The next received batch, split into messages never seen before and messages seen
    /// again (their hold expired; the new receipt handle replaces the old). `None` when the
    /// queue has nothing more to show.
    async fn next(&mut self) -> OpsResult<Option<(Vec<DlqMessage>, Vec<DlqMessage>)>> {
        if self.done || self.seen.len() >= self.max {
            return Ok(None);
        }
        let sqs = &self.ctx.sqs;
        let out = self
            .ctx
            .sqs_call("ReceiveMessage", Some((self.url, "TRIAGE_DLQ_URL")), || {
                sqs.receive_message()
                    .queue_url(self.url)
                    .max_number_of_messages(10)
                    // A long poll asks every SQS server, so an empty answer means the queue has
                    // no visible message left (a short poll samples and can come back empty
                    // early).
                    .wait_time_seconds(1)
                    .visibility_timeout(self.visibility)
                    .message_system_attribute_names(MessageSystemAttributeName::All)
                    .message_attribute_names("All")
                    .send()
            })
            .await?;
        let messages = out.messages.unwrap_or_default();
        if messages.is_empty() {
            self.done = true;
            return Ok(None);
        }
        let (mut new, mut again) = (Vec::new(), Vec::new());
        for m in messages.into_iter().filter_map(DlqMessage::from_sdk) {
            if self.seen.insert(m.message_id.clone()) {
                new.push(m);
            } else {
                again.push(m);
            }
        }
        if new.is_empty() {
            self.stale_rounds += 1;
            if self.stale_rounds >= STALE_ROUNDS {
                self.done = true;
            }
        } else {
            self.stale_rounds = 0;
        }
        Ok(Some((new, again)))
    }
}

/// Makes held messages visible again (visibility 0), ten per call. Failures are counted,
/// not fatal: those messages come back on their own when their hold expires.
async fn release(ctx: &Ctx, url: &str, handles: impl IntoIterator<Item = String>) -> usize {
    let entries: Vec<(usize, String, i32)> =
        handles.into_iter().enumerate().map(|(k, h)| (k, h, 0)).collect();
    if entries.is_empty() {
        return 0;
    }
    ctx.sqs_effects()
        .change_visibility(url, entries, None)
        .await
        .failed
        .len()
}

/// Deletes messages by receipt handle, `(message id, handle)`, ten per call; returns the
/// message ids whose delete was not confirmed.
async fn delete(ctx: &Ctx, url: &str, handles: &[(String, String)]) -> Vec<String> {
    if handles.is_empty() {
        return Vec::new();
    }
    let entries: Vec<(usize, String)> = handles
        .iter()
        .enumerate()
        .map(|(k, (_, h))| (k, h.clone()))
        .collect();
    let r = ctx.sqs_effects().delete(url, entries, None).await;
    r.failed
        .into_iter()
        .filter_map(|(k, _)| handles.get(k).map(|(id, _)| id.clone()))
        .collect()
}

/// Reads the whole DLQ (up to `max` messages) and makes everything visible again.
pub async fn read_all(ctx: &Ctx, dlq_url: &str, max: usize) -> OpsResult<Vec<DlqMessage>> {
    let mut sweep = Sweep::new(ctx, dlq_url, Duration::from_secs(60), max);
    let mut found: HashMap<String, DlqMessage> = HashMap::new();
    let result = async {
        while let Some((new, again)) = sweep.next().await? {
            for m in new.into_iter().chain(again) {
                found.insert(m.message_id.clone(), m);
            }
        }
        Ok::<_, OpsError>(())
    }
    .await;
    release(ctx, dlq_url, found.values().map(|m| m.receipt_handle.clone())).await;
    result?;
    let mut all: Vec<DlqMessage> = found.into_values().collect();
    all.sort_by_key(|m| (m.failed_at_ms(), m.message_id.clone()));
    Ok(all)
}

// ---------------------------------------------------------------- list

/// One error text and how many messages of a group carry it.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorCount {
    /// The error text.
    pub error: String,
    /// Messages with it.
    pub count: usize,
}

/// DLQ messages of one job type and failure class.
#[derive(Debug, Clone, Serialize)]
pub struct Group {
    /// Job type (`-` when it cannot be told).
    pub job_type: String,
    /// Failure class.
    pub class: String,
    /// Messages in the group.
    pub count: usize,
    /// Age of the oldest failure, in seconds.
    pub oldest_age_s: u64,
    /// Age of the newest failure, in seconds.
    pub newest_age_s: u64,
    /// Distinct error texts, most frequent first (at most 5).
    pub errors: Vec<ErrorCount>,
}

/// One message, as listed with `--messages`.
#[derive(Debug, Clone, Serialize)]
pub struct MessageSummary {
    /// DLQ message id.
    pub message_id: String,
    /// Job id.
    pub job_id: String,
    /// Job type.
    pub job_type: String,
    /// Failure class.
    pub class: String,
    /// Handler executions before it failed, when recorded.
    pub attempts: Option<u32>,
    /// Age of the failure, in seconds.
    pub age_s: u64,
    /// Error text.
    pub error: String,
    /// The queue it came from, when recorded.
    pub source_queue: Option<String>,
}

impl MessageSummary {
    fn of(m: &DlqMessage, now: u64) -> Self {
        Self {
            message_id: m.message_id.clone(),
            job_id: m.job_id(),
            job_type: m.job_type(),
            class: m.class().to_owned(),
            attempts: m.record.as_ref().map(|r| r.attempts),
            age_s: now.saturating_sub(m.failed_at_ms()) / 1000,
            error: m.error(),
            source_queue: m.record.as_ref().map(|r| r.source_queue.clone()),
        }
    }
}

/// What `dlq list` shows.
#[derive(Debug, Clone, Serialize)]
pub struct ListReport {
    /// The DLQ.
    pub dlq_url: String,
    /// Messages seen.
    pub total: usize,
    /// Messages by job type and class, largest group first.
    pub groups: Vec<Group>,
    /// Every message, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<MessageSummary>>,
}

impl Report for ListReport {
    fn human(&self) -> String {
        if self.total == 0 {
            return format!("DLQ {} is empty\n", self.dlq_url);
        }
        let mut out = format!("DLQ {}: {} message(s)\n\n", self.dlq_url, self.total);
        let mut t = Table::new(["TYPE", "CLASS", "COUNT", "OLDEST", "NEWEST", "ERROR"]);
        for g in &self.groups {
            let mut err = g.errors.first().map(|e| e.error.clone()).unwrap_or_default();
            if g.errors.len() > 1 {
                err = format!("{err} (+{} other)", g.errors.len() - 1);
            }
            t.row([
                g.job_type.clone(),
                g.class.clone(),
                g.count.to_string(),
                super::output::age(Duration::from_secs(g.oldest_age_s)),
                super::output::age(Duration::from_secs(g.newest_age_s)),
                err,
            ]);
        }
        out.push_str(&t.render());
        if let Some(messages) = &self.messages {
            out.push('\n');
            let mut t = Table::new(["JOB ID", "TYPE", "CLASS", "ATTEMPTS", "AGE", "ERROR"]);
            for m in messages {
                t.row([
                    m.job_id.clone(),
                    m.job_type.clone(),
                    m.class.clone(),
                    m.attempts.map(|a| a.to_string()).unwrap_or_else(|| "-".into()),
                    super::output::age(Duration::from_secs(m.age_s)),
                    m.error.clone(),
                ]);
            }
            out.push_str(&t.render());
        }
        out
    }
}

/// Groups messages by job type and class.
pub fn group(messages: &[DlqMessage], now: u64) -> Vec<Group> {
    let mut by: BTreeMap<(String, String), Vec<&DlqMessage>> = BTreeMap::new();
    for m in messages {
        by.entry((m.job_type(), m.class().to_owned()))
            .or_default()
            .push(m);
    }
    let mut groups: Vec<Group> = by
        .into_iter()
        .map(|((job_type, class), ms)| {
            let mut errors: HashMap<String, usize> = HashMap::new();
            for m in &ms {
                *errors.entry(m.error()).or_default() += 1;
            }
            let mut errors: Vec<ErrorCount> = errors
                .into_iter()
                .map(|(error, count)| ErrorCount { error, count })
                .collect();
            errors.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.error.cmp(&b.error)));
            errors.truncate(5);
            let ages = ms.iter().map(|m| now.saturating_sub(m.failed_at_ms()) / 1000);
            Group {
                job_type,
                class,
                count: ms.len(),
                oldest_age_s: ages.clone().max().unwrap_or(0),
                newest_age_s: ages.min().unwrap_or(0),
                errors,
            }
        })
        .collect();
    groups.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.job_type.cmp(&b.job_type)));
    groups
}

/// `dlq list`: what is in the DLQ, grouped, without removing anything.
pub async fn list(
    ctx: &Ctx,
    dlq_url: &str,
    filter: &Filter,
    with_messages: bool,
    max: usize,
) -> OpsResult<ListReport> {
    filter.validate()?;
    let now = now_ms();
    let all: Vec<DlqMessage> = read_all(ctx, dlq_url, max)
        .await?
        .into_iter()
        .filter(|m| filter.matches(m, now))
        .collect();
    Ok(ListReport {
        dlq_url: dlq_url.to_owned(),
        total: all.len(),
        groups: group(&all, now),
        messages: with_messages.then(|| all.iter().map(|m| MessageSummary::of(m, now)).collect()),
    })
}

// ---------------------------------------------------------------- show

/// One message in full.
#[derive(Debug, Clone, Serialize)]
pub struct ShownMessage {
    /// Summary fields.
    #[serde(flatten)]
    pub summary: MessageSummary,
    /// The full failure record, if any.
    pub record: Option<FailureRecord>,
    /// The body as stored.
    pub body: String,
    /// The original message attributes (string values; binary ones as `<binary N bytes>`).
    pub attributes: BTreeMap<String, String>,
    /// When it entered the DLQ (epoch ms).
    pub dlq_sent_at: u64,
}

/// What `dlq show` prints.
#[derive(Debug, Clone, Serialize)]
pub struct ShowReport {
    /// The id asked for.
    pub id: String,
    /// Every DLQ message with that job id or message id.
    pub messages: Vec<ShownMessage>,
}

impl Report for ShowReport {
    fn human(&self) -> String {
        let mut out = String::new();
        for (i, m) in self.messages.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            let s = &m.summary;
            let mut t = Table::new(["FIELD", "VALUE"]).max_width(200);
            t.row(["message id", s.message_id.as_str()]);
            t.row(["job id", s.job_id.as_str()]);
            t.row(["job type", s.job_type.as_str()]);
            t.row(["class", s.class.as_str()]);
            t.row([
                "attempts".to_string(),
                s.attempts.map(|a| a.to_string()).unwrap_or_else(|| "-".into()),
            ]);
            t.row([
                "age".to_string(),
                super::output::age(Duration::from_secs(s.age_s)),
            ]);
            t.row(["error", s.error.as_str()]);
            if let Some(r) = &m.record {
                t.row(["source queue", r.source_queue.as_str()]);
                t.row(["original message", r.original_message_id.as_str()]);
            }
            for (k, v) in &m.attributes {
                t.row([format!("attribute {k}"), v.clone()]);
            }
            t.row(["body", m.body.as_str()]);
            out.push_str(&t.render());
        }
        out
    }
}

/// `dlq show ID`: every DLQ message whose job id, message id or original message id is `id`.
pub async fn show(ctx: &Ctx, dlq_url: &str, id: &str, max: usize) -> OpsResult<ShowReport> {
    let now = now_ms();
    let filter = Filter {
        ids: vec![id.to_owned()],
        ..Filter::default()
    };
    let messages: Vec<ShownMessage> = read_all(ctx, dlq_url, max)
        .await?
        .into_iter()
        .filter(|m| filter.matches(m, now))
        .map(|m| {
            let attributes = original_attributes(&m.attributes)
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| {
                    let shown = match (v.string_value(), v.binary_value()) {
                        (Some(s), _) => s.to_owned(),
                        (None, Some(b)) => format!("<binary {} bytes>", b.as_ref().len()),
                        _ => String::new(),
                    };
                    (k, shown)
                })
                .collect();
            ShownMessage {
                summary: MessageSummary::of(&m, now),
                record: m.record.clone(),
                body: m.body.clone(),
                attributes,
                dlq_sent_at: m.sent_at_ms,
            }
        })
        .collect();
    if messages.is_empty() {
        return Err(OpsError::new(
            ErrorKind::NotFound,
            format!(
                "no DLQ message with job id or message id `{id}` in {dlq_url}: see `triage dlq list --messages`"
            ),
        ));
    }
    Ok(ShowReport {
        id: id.to_owned(),
        messages,
    })
}

// ---------------------------------------------------------------- replay

/// How `dlq replay` runs.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// Which messages.
    pub filter: Filter,
    /// Target queue (URL, ARN or name) instead of each record's source queue.
    pub to: Option<String>,
    /// Move at most this many.
    pub limit: Option<usize>,
    /// Messages per second.
    pub rate: Option<f64>,
    /// Report what would move, move nothing.
    pub dry_run: bool,
    /// State table, for the fresh attempt ledgers (required unless `dry_run`).
    pub table: Option<String>,
    /// Draw a progress bar.
    pub progress: bool,
    /// Read at most this many DLQ messages.
    pub max_scan: usize,
    /// Set (e.g. on Ctrl-C) to stop after the batch in progress; what was not moved is
    /// released and reported.
    pub stop: Option<Arc<AtomicBool>>,
}

/// Where replayed messages went.
#[derive(Debug, Clone, Serialize)]
pub struct TargetCount {
    /// Target queue URL.
    pub queue_url: String,
    /// Messages sent there.
    pub count: usize,
}

/// A message that was selected but not moved, and why.
#[derive(Debug, Clone, Serialize)]
pub struct NotMoved {
    /// DLQ message id.
    pub message_id: String,
    /// Job id.
    pub job_id: String,
    /// Why.
    pub reason: String,
}

/// What `dlq replay` did.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// The DLQ.
    pub dlq_url: String,
    /// Nothing was moved.
    pub dry_run: bool,
    /// DLQ messages read.
    pub scanned: usize,
    /// Messages the filter (and limit) selected.
    pub selected: usize,
    /// Selected messages sent to their target (or that would be, in a dry run).
    pub moved: usize,
    /// Moved messages whose DLQ copy could not be deleted: they may run twice.
    pub delete_failed: usize,
    /// Attempt ledgers reset.
    pub ledgers_reset: usize,
    /// Sent per target queue.
    pub targets: Vec<TargetCount>,
    /// Selected messages by job type and class.
    pub groups: Vec<Group>,
    /// Selected messages that were not moved.
    pub not_moved: Vec<NotMoved>,
    /// Selected messages whose failure record names another job than their body: moved (or
    /// skipped) like the others, but only the body's job has its ledger reset.
    pub unverified: Vec<NotMoved>,
    /// Stopped early by the operator.
    pub interrupted: bool,
    /// Wall time, in milliseconds.
    pub elapsed_ms: u64,
}

impl Report for ReplayReport {
    fn human(&self) -> String {
        let verb = if self.dry_run { "would move" } else { "moved" };
        let mut out = format!(
            "{}{verb} {} of {} selected message(s) ({} read from the DLQ) in {:.1}s\n",
            if self.dry_run { "dry run: " } else { "" },
            self.moved,
            self.selected,
            self.scanned,
            self.elapsed_ms as f64 / 1000.0
        );
        if !self.targets.is_empty() {
            let mut t = Table::new(["TARGET", "COUNT"]).max_width(120);
            for c in &self.targets {
                t.row([c.queue_url.clone(), c.count.to_string()]);
            }
            out.push_str(&t.render());
        }
        if !self.groups.is_empty() {
            let mut t = Table::new(["TYPE", "CLASS", "SELECTED"]);
            for g in &self.groups {
                t.row([g.job_type.clone(), g.class.clone(), g.count.to_string()]);
            }
            out.push_str(&t.render());
        }
        if !self.dry_run {
            out.push_str(&format!("attempt ledgers reset: {}\n", self.ledgers_reset));
        }
        for n in &self.unverified {
            out.push_str(&format!(
                "unverified record: message {}: {} (only the body's job counts)\n",
                n.message_id, n.reason
            ));
        }
        for n in &self.not_moved {
            out.push_str(&format!(
                "not moved: job {} ({}): {}\n",
                n.job_id, n.message_id, n.reason
            ));
        }
        if self.delete_failed > 0 {
            out.push_str(&format!(
                "{} moved message(s) are still in the DLQ (delete failed): they may run twice\n",
                self.delete_failed
            ));
        }
        out
    }

    fn problem(&self) -> Option<String> {
        if self.dry_run {
            return None;
        }
        if self.interrupted {
            return Some(format!(
                "interrupted after moving {} of {} selected message(s); the rest are still in the DLQ",
                self.moved, self.selected
            ));
        }
        if self.moved < self.selected {
            return Some(format!(
                "{} of {} selected message(s) were not moved (see above); they are still in the DLQ",
                self.selected - self.moved,
                self.selected
            ));
        }
        (self.delete_failed > 0).then(|| {
            format!(
                "{} moved message(s) could not be deleted from the DLQ: run `triage dlq purge` for them",
                self.delete_failed
            )
        })
    }
}

/// Paces sends to `rate` messages per second, starting with an empty bucket: n messages take
/// at least n / rate seconds.
struct Pacer {
    start: Instant,
    per_message: Option<Duration>,
    issued: u32,
}

impl Pacer {
    fn new(rate: Option<f64>) -> Self {
        Self {
            start: Instant::now(),
            per_message: rate.map(|r| Duration::from_secs_f64(1.0 / r)),
            issued: 0,
        }
    }

    async fn take(&mut self, n: usize) {
        let Some(per) = self.per_message else { return };
        self.issued += n as u32;
        tokio::time::sleep_until((self.start + per * self.issued).into()).await;
    }
}

/// Deletes the attempt ledgers of `jobs` (`(job type, job id)` pairs, batched through the
/// ledger's `forget`), so replayed jobs start again from attempt 1.
pub async fn reset_ledgers(ctx: &Ctx, table: &str, jobs: &[(String, String)]) -> OpsResult<usize> {
    let unique: HashSet<(&str, &str)> = jobs.iter().map(|(t, id)| (t.as_str(), id.as_str())).collect();
    ctx.ledger(table)
        .forget(unique.iter().copied(), None)
        .await
        .map_err(|e| ctx.storage_error(e, table))?;
    Ok(unique.len())
}

async fn check_table(ctx: &Ctx, table: &str) -> OpsResult<()> {
    ctx.ddb_call("DescribeTable", table, || {
        ctx.ddb.describe_table().table_name(table).send()
    })
    .await?;
    Ok(())
}

/// Checks a queue exists; returns its URL.
async fn check_queue(ctx: &Ctx, queue: &str, var: &str) -> OpsResult<String> {
    let url = resolve_queue(ctx, queue, var).await?;
    queue_arn(ctx, &url, var).await?;
    Ok(url)
}

/// Checks that `source` (a failure record's source queue) sends its dead letters to the DLQ
/// `dlq_arn` (its RedrivePolicy's `deadLetterTargetArn`); returns its URL. A record is only
/// trusted to name a queue that feeds this DLQ: anything else could be a producer's forgery
/// pointing at any queue the operator can write to.
async fn verified_source(ctx: &Ctx, source: &str, dlq_arn: &str) -> Result<String, String> {
    let url = resolve_queue(ctx, source, "the failure record")
        .await
        .map_err(|e| format!("{e}; pass --to QUEUE"))?;
    let out = ctx
        .sqs_call("GetQueueAttributes", Some((&url, "the failure record")), || {
            ctx.sqs
                .get_queue_attributes()
                .queue_url(&url)
                .attribute_names(QueueAttributeName::RedrivePolicy)
                .send()
        })
        .await
        .map_err(|e| format!("{e}; pass --to QUEUE"))?;
    let target = out
        .attributes
        .and_then(|mut a| a.remove(&QueueAttributeName::RedrivePolicy))
        .and_then(|p| serde_json::from_str::<serde_json::Value>(&p).ok())
        .and_then(|p| p["deadLetterTargetArn"].as_str().map(str::to_owned));
    match target {
        Some(arn) if arn == dlq_arn => Ok(url),
        Some(arn) => Err(format!(
            "the failure record names source queue {url}, whose dead-letter queue is {arn}, not this DLQ: \
             the record is not trusted; pass --to QUEUE"
        )),
        None => Err(format!(
            "the failure record names source queue {url}, which has no redrive policy naming this DLQ as \
             its dead-letter queue: the record is not trusted; pass --to QUEUE"
        )),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Not selected, or selected but not moved: made visible again at the end.
    Held,
    /// Sent to its target and deleted from the DLQ.
    Moved,
    /// Sent to its target, but the DLQ delete failed: delete again if seen again.
    MovedUndeleted,
}

/// `dlq replay`: moves selected DLQ messages back to their source queue (or `--to`).
///
/// Without `--to`, a message goes back to its failure record's source queue only when that
/// queue's RedrivePolicy names this DLQ (checked once per queue); otherwise it stays and is
/// reported. The job whose ledger is reset is the one the body names (read as the processor
/// reads it), never the record's; a record that disagrees with its body is reported as
/// unverified.
pub async fn replay(ctx: &Ctx, dlq_url: &str, opts: &ReplayOptions) -> OpsResult<ReplayReport> {
    opts.filter.validate()?;
    if let Some(r) = opts.rate {
        if !(r.is_finite() && r > 0.0) {
            return Err(OpsError::usage(
                "--rate must be a positive number of messages per second",
            ));
        }
    }
    if opts.limit == Some(0) {
        return Err(OpsError::usage("--limit must be at least 1"));
    }
    let table = match (&opts.table, opts.dry_run) {
        (Some(t), _) => Some(t.clone()),
        (None, true) => None,
        (None, false) => return Err(OpsError::missing_var("TRIAGE_TABLE", "--table")),
    };
    // Fail before touching the DLQ when the DLQ, the table or the --to queue is missing.
    let dlq_arn = queue_arn(ctx, dlq_url, "TRIAGE_DLQ_URL").await?;
    if let (Some(t), false) = (&table, opts.dry_run) {
        check_table(ctx, t).await?;
    }
    let to = match &opts.to {
        Some(q) => Some(check_queue(ctx, q, "--to").await?),
        None => None,
    };

    let started = Instant::now();
    // Batches as large as the rate allows, so pacing stays smooth at low rates.
    let batch_size = opts.rate.map_or(10, |r| (r.floor() as usize).clamp(1, 10));
    // A batch must be sent and deleted before its hold expires.
    let hold = Duration::from_secs(60)
        + opts
            .rate
            .map_or(Duration::ZERO, |r| Duration::from_secs_f64(20.0 / r));
    let estimate = approximate_count(ctx, dlq_url).await.unwrap_or(0);
    let bar_len = opts.limit.map_or(estimate, |l| estimate.min(l as u64));
    let bar = progress(
        opts.progress,
        bar_len,
        if opts.dry_run { "reading" } else { "replaying" },
    );

    let mut st = ReplayState {
        fates: HashMap::new(),
        handles: HashMap::new(),
        selected: Vec::new(),
        moved: 0,
        delete_failed: 0,
        ledgers_reset: 0,
        targets: BTreeMap::new(),
        not_moved: Vec::new(),
        unverified: Vec::new(),
        target_cache: HashMap::new(),
        dlq_arn,
        scanned: 0,
    };
    let sqs = ctx.sqs_effects();
    let stopped = || opts.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst));
    let mut pacer = Pacer::new(opts.rate);
    let mut sweep = Sweep::new(ctx, dlq_url, hold, opts.max_scan);
    let run = async {
        loop {
            if opts.limit.is_some_and(|l| st.selected.len() >= l) || stopped() {
                break;
            }
            let Some((new, again)) = sweep.next().await? else {
                break;
            };
            st.scanned += new.len();
            for m in again {
                match st.fates.get(&m.message_id) {
                    Some(Fate::MovedUndeleted) => {
                        let failed =
                            delete(ctx, dlq_url, &[(m.message_id.clone(), m.receipt_handle.clone())]).await;
                        if failed.is_empty() {
                            st.fates.insert(m.message_id.clone(), Fate::Moved);
                            st.delete_failed = st.delete_failed.saturating_sub(1);
                        }
                    }
                    _ => {
                        st.handles.insert(m.message_id.clone(), m.receipt_handle.clone());
                    }
                }
            }
            let now = now_ms();
            let mut chosen = Vec::new();
            for m in new {
                let room = opts.limit.is_none_or(|l| st.selected.len() < l);
                st.fates.insert(m.message_id.clone(), Fate::Held);
                st.handles.insert(m.message_id.clone(), m.receipt_handle.clone());
                if room && opts.filter.matches(&m, now) {
                    if let Some(reason) = m.record_mismatch() {
                        st.unverified.push(NotMoved {
                            message_id: m.message_id.clone(),
                            job_id: body_job_id(&m),
                            reason,
                        });
                    }
                    st.selected.push(m.clone());
                    chosen.push(m);
                }
            }
            // Group by target queue, keeping DLQ order within each.
            let mut by_target: BTreeMap<String, Vec<DlqMessage>> = BTreeMap::new();
            for m in chosen {
                match st.target_for(ctx, &m, to.as_deref()).await {
                    Ok(url) => by_target.entry(url).or_default().push(m),
                    Err(reason) => {
                        bar.inc(1);
                        st.not_moved.push(NotMoved {
                            message_id: m.message_id.clone(),
                            job_id: body_job_id(&m),
                            reason,
                        });
                    }
                }
            }
            if opts.dry_run {
                for (url, ms) in by_target {
                    st.moved += ms.len();
                    bar.inc(ms.len() as u64);
                    *st.targets.entry(url).or_default() += ms.len();
                }
                continue;
            }
            for (target, ms) in by_target {
                let fifo = is_fifo(&target);
                let mut outgoing = Vec::new();
                for (key, m) in ms.iter().enumerate() {
                    match replay_copy(key, m, fifo) {
                        Ok(o) => outgoing.push(o),
                        Err(reason) => {
                            bar.inc(1);
                            st.not_moved.push(NotMoved {
                                message_id: m.message_id.clone(),
                                job_id: body_job_id(m),
                                reason,
                            });
                        }
                    }
                }
                for batch in batches(outgoing, batch_size) {
                    if stopped() {
                        break;
                    }
                    let n = batch.len();
                    pacer.take(n).await;
                    st.move_batch(ctx, &sqs, dlq_url, &target, table.as_deref(), &ms, batch)
                        .await?;
                    bar.inc(n as u64);
                }
            }
        }
        Ok::<_, OpsError>(())
    }
    .await;
    bar.finish_and_clear();
    // Everything not moved goes back to visible, whatever happened above.
    let held: Vec<String> = st
        .fates
        .iter()
        .filter(|(_, f)| **f == Fate::Held)
        .filter_map(|(id, _)| st.handles.get(id).cloned())
        .collect();
    release(ctx, dlq_url, held).await;
    run?;

    let now = now_ms();
    Ok(ReplayReport {
        dlq_url: dlq_url.to_owned(),
        dry_run: opts.dry_run,
        scanned: st.scanned,
        selected: st.selected.len(),
        moved: st.moved,
        delete_failed: st.delete_failed,
        ledgers_reset: st.ledgers_reset,
        targets: st
            .targets
            .into_iter()
            .map(|(queue_url, count)| TargetCount { queue_url, count })
            .collect(),
        groups: group(&st.selected, now),
        not_moved: st.not_moved,
        unverified: st.unverified,
        interrupted: stopped(),
        elapsed_ms: started.elapsed().as_millis() as u64,
    })
}

/// The job id to show for a message: the body's, else what [`DlqMessage::job_id`] finds.
fn body_job_id(m: &DlqMessage) -> String {
    m.body_job().and_then(|j| j.id).unwrap_or_else(|| m.job_id())
}

/// The message replay sends for DLQ message `m`: the body byte for byte and the original
/// attributes (unpacked when the processor packed them).
fn replay_copy(key: usize, m: &DlqMessage, fifo: bool) -> Result<Outgoing, String> {
    let attributes = original_attributes(&m.attributes).map_err(|e| e.to_string())?;
    Ok(Outgoing {
        key,
        body: m.body.clone(),
        attributes,
        // A fresh deduplication id per DLQ message: the original one may still be inside
        // SQS's 5-minute window, and a repeated replay of the same DLQ message (after a crash
        // between send and delete) is then deduplicated.
        group_id: fifo.then(|| m.group_id.clone().unwrap_or_else(|| body_job_id(m))),
        dedup_id: fifo.then(|| format!("replay-{}", m.message_id)),
        delay_seconds: None,
    })
}

struct ReplayState {
    fates: HashMap<String, Fate>,
    handles: HashMap<String, String>,
    selected: Vec<DlqMessage>,
    moved: usize,
    delete_failed: usize,
    ledgers_reset: usize,
    targets: BTreeMap<String, usize>,
    not_moved: Vec<NotMoved>,
    unverified: Vec<NotMoved>,
    target_cache: HashMap<String, Result<String, String>>,
    dlq_arn: String,
    scanned: usize,
}

impl ReplayState {
    /// The queue a message goes back to: `--to`, else the record's source queue once its
    /// redrive policy is checked to name this DLQ (once per queue).
    async fn target_for(&mut self, ctx: &Ctx, m: &DlqMessage, to: Option<&str>) -> Result<String, String> {
        if let Some(to) = to {
            return Ok(to.to_owned());
        }
        let Some(source) = m.record.as_ref().map(|r| r.source_queue.clone()) else {
            return Err("no failure record, so no source queue: pass --to QUEUE".into());
        };
        if let Some(r) = self.target_cache.get(&source) {
            return r.clone();
        }
        let r = verified_source(ctx, &source, &self.dlq_arn).await;
        self.target_cache.insert(source, r.clone());
        r
    }

    /// Resets the ledgers of the batch's jobs, sends the batch to `target`, then deletes what
    /// SQS accepted. `ms` are the DLQ messages the batch's keys index.
    #[allow(clippy::too_many_arguments)]
    async fn move_batch(
        &mut self,
        ctx: &Ctx,
        sqs: &Sqs,
        dlq_url: &str,
        target: &str,
        table: Option<&str>,
        ms: &[DlqMessage],
        batch: Vec<Outgoing>,
    ) -> OpsResult<()> {
        // Reset before sending: once the job is back on its queue a worker may count a new
        // attempt at any moment, and that count must not be wiped. The job is the one its body
        // names, as the processor will read it (type and id); a job without an id gets a new
        // message id, hence a fresh ledger, when it is sent again.
        if let Some(table) = table {
            let jobs: Vec<(String, String)> = batch
                .iter()
                .filter_map(|o| ms.get(o.key).and_then(DlqMessage::body_job))
                .filter_map(|j| j.id.map(|id| (j.job_type, id)))
                .collect();
            if !jobs.is_empty() {
                self.ledgers_reset += reset_ledgers(ctx, table, &jobs).await?;
            }
        }
        let sent = sqs.send(target, batch, None).await;
        for (k, why) in &sent.failed {
            if let Some(m) = ms.get(*k) {
                self.not_moved.push(NotMoved {
                    message_id: m.message_id.clone(),
                    job_id: body_job_id(m),
                    reason: why.clone(),
                });
            }
        }
        let accepted: Vec<(String, String)> = sent
            .accepted
            .iter()
            .filter_map(|k| ms.get(*k))
            .map(|m| (m.message_id.clone(), m.receipt_handle.clone()))
            .collect();
        self.moved += accepted.len();
        *self.targets.entry(target.to_owned()).or_default() += accepted.len();
        for (id, _) in &accepted {
            self.fates.insert(id.clone(), Fate::Moved);
        }
        let failed = delete(ctx, dlq_url, &accepted).await;
        self.delete_failed += failed.len();
        for id in failed {
            self.fates.insert(id, Fate::MovedUndeleted);
        }
        Ok(())
    }
}

async fn approximate_count(ctx: &Ctx, url: &str) -> Option<u64> {
    let out = ctx
        .storage_retry()
        .call("GetQueueAttributes", None, || {
            ctx.sqs
                .get_queue_attributes()
                .queue_url(url)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
                .send()
        })
        .await
        .ok()?;
    out.attributes?
        .get(&QueueAttributeName::ApproximateNumberOfMessages)?
        .parse()
        .ok()
}

// ---------------------------------------------------------------- purge

/// What `dlq purge` is about to delete, for the confirmation prompt.
#[derive(Debug, Clone, Serialize)]
pub struct PurgePlan {
    /// The DLQ.
    pub dlq_url: String,
    /// Messages read.
    pub scanned: usize,
    /// Messages selected for deletion, by job type and class.
    pub groups: Vec<Group>,
    /// Messages selected.
    pub selected: usize,
}

/// What `dlq purge` did.
#[derive(Debug, Clone, Serialize)]
pub struct PurgeReport {
    /// The plan that was confirmed.
    #[serde(flatten)]
    pub plan: PurgePlan,
    /// Messages deleted.
    pub deleted: usize,
    /// Selected messages that were not deleted (still in the DLQ, unless someone else
    /// deleted them).
    pub failed: usize,
    /// Of those, messages whose hold had expired when the purge was confirmed and that could
    /// not be received again (another reader holds them, or they are gone).
    pub lost_hold: usize,
}

impl Report for PurgeReport {
    fn human(&self) -> String {
        format!(
            "deleted {} of {} selected message(s) from {}\n",
            self.deleted, self.plan.selected, self.plan.dlq_url
        )
    }

    fn problem(&self) -> Option<String> {
        (self.failed > 0).then(|| {
            let mut p = format!("{} selected message(s) were not deleted", self.failed);
            if self.lost_hold > 0 {
                p.push_str(&format!(
                    " ({} were no longer held when the purge was confirmed and another reader has them or deleted them; run the purge again)",
                    self.lost_hold
                ));
            }
            p
        })
    }
}

impl PurgePlan {
    /// The confirmation question.
    pub fn question(&self) -> String {
        let mut q = format!(
            "delete {} of {} message(s) from {}",
            self.selected, self.scanned, self.dlq_url
        );
        let parts: Vec<String> = self
            .groups
            .iter()
            .map(|g| format!("{} {} × {}", g.count, g.job_type, g.class))
            .collect();
        if !parts.is_empty() {
            q.push_str(&format!(" ({})", parts.join(", ")));
        }
        q + "? This cannot be undone. [y/N] "
    }
}

/// How `dlq purge` runs.
#[derive(Debug, Clone)]
pub struct PurgeOptions {
    /// Which messages.
    pub filter: Filter,
    /// Delete at most this many.
    pub limit: Option<usize>,
    /// Read at most this many DLQ messages.
    pub max_scan: usize,
    /// How long the selection is held invisible while the operator reads the question
    /// (default 15 minutes).
    pub hold: Duration,
}

impl Default for PurgeOptions {
    fn default() -> Self {
        Self {
            filter: Filter::default(),
            limit: None,
            max_scan: 100_000,
            hold: Duration::from_secs(900),
        }
    }
}

/// `dlq purge`: deletes the selected DLQ messages once `confirm` approves the plan.
pub async fn purge(
    ctx: &Ctx,
    dlq_url: &str,
    filter: &Filter,
    limit: Option<usize>,
    max_scan: usize,
    confirm: impl FnOnce(&PurgePlan) -> bool,
) -> OpsResult<PurgeReport> {
    let opts = PurgeOptions {
        filter: filter.clone(),
        limit,
        max_scan,
        ..PurgeOptions::default()
    };
    purge_with(ctx, dlq_url, &opts, confirm).await
}

/// [`purge`] with every option.
pub async fn purge_with(
    ctx: &Ctx,
    dlq_url: &str,
    opts: &PurgeOptions,
    confirm: impl FnOnce(&PurgePlan) -> bool,
) -> OpsResult<PurgeReport> {
    let (filter, limit, max_scan) = (&opts.filter, opts.limit, opts.max_scan);
    filter.validate()?;
    // Long holds: the selection must stay ours while the operator reads the question.
    let mut sweep = Sweep::new(ctx, dlq_url, opts.hold, max_scan);
    // Message id → (receipt handle, when the receive that gave it was asked for).
    let mut held: HashMap<String, (String, Instant)> = HashMap::new();
    let mut selected: Vec<DlqMessage> = Vec::new();
    let mut scanned = 0;
    let now = now_ms();
    let read = async {
        loop {
            let asked = Instant::now();
            let Some((new, again)) = sweep.next().await? else {
                break;
            };
            scanned += new.len();
            for m in again {
                held.insert(m.message_id.clone(), (m.receipt_handle.clone(), asked));
            }
            for m in new {
                held.insert(m.message_id.clone(), (m.receipt_handle.clone(), asked));
                if limit.is_none_or(|l| selected.len() < l) && filter.matches(&m, now) {
                    selected.push(m);
                }
            }
        }
        Ok::<_, OpsError>(())
    }
    .await;
    let handles = |held: HashMap<String, (String, Instant)>| held.into_values().map(|(h, _)| h);
    if let Err(e) = read {
        release(ctx, dlq_url, handles(held)).await;
        return Err(e);
    }
    let plan = PurgePlan {
        dlq_url: dlq_url.to_owned(),
        scanned,
        groups: group(&selected, now),
        selected: selected.len(),
    };
    if plan.selected == 0 {
        release(ctx, dlq_url, handles(held)).await;
        return Ok(PurgeReport {
            plan,
            deleted: 0,
            failed: 0,
            lost_hold: 0,
        });
    }
    if !confirm(&plan) {
        release(ctx, dlq_url, handles(held)).await;
        return Err(OpsError::usage("purge cancelled: nothing was deleted"));
    }

    // A receipt handle only deletes while its hold lasts: after it expires, another reader may
    // have received the message (SQS then accepts the stale handle and deletes nothing). So a
    // handle whose hold is over, or nearly, is never used: the message is received again by
    // id, and what cannot be found again is reported, not counted as deleted.
    let margin = (opts.hold / 4).min(Duration::from_secs(30));
    let confirmed = Instant::now();
    let holds = |asked: Instant| confirmed + margin < asked + opts.hold;
    let mut targets: Vec<(String, String)> = Vec::new();
    let mut stale: HashSet<String> = HashSet::new();
    for m in &selected {
        match held.remove(&m.message_id) {
            Some((h, asked)) if holds(asked) => targets.push((m.message_id.clone(), h)),
            _ => {
                stale.insert(m.message_id.clone());
            }
        }
    }
    let still_held: Vec<String> = held
        .into_values()
        .filter(|(_, asked)| holds(*asked))
        .map(|(h, _)| h)
        .collect();
    if !stale.is_empty() {
        let found = receive_again(ctx, dlq_url, &mut stale, max_scan).await;
        targets.extend(found);
    }
    let failed_ids = delete(ctx, dlq_url, &targets).await;
    release(ctx, dlq_url, still_held).await;
    let deleted = targets.len() - failed_ids.len();
    Ok(PurgeReport {
        deleted,
        failed: plan.selected - deleted,
        lost_hold: stale.len(),
        plan,
    })
}

/// Receives the DLQ again looking for the messages in `wanted` (by message id), to delete them
/// with fresh receipt handles. Returns `(message id, handle)` of those found and removes them
/// from `wanted`; every other message received is made visible again.
async fn receive_again(
    ctx: &Ctx,
    dlq_url: &str,
    wanted: &mut HashSet<String>,
    max_scan: usize,
) -> Vec<(String, String)> {
    let mut sweep = Sweep::new(ctx, dlq_url, Duration::from_secs(60), max_scan);
    let mut found = Vec::new();
    let mut others: HashMap<String, String> = HashMap::new();
    while !wanted.is_empty() {
        let Ok(Some((new, again))) = sweep.next().await else {
            break;
        };
        for m in new.into_iter().chain(again) {
            if wanted.remove(&m.message_id) {
                found.push((m.message_id, m.receipt_handle));
            } else {
                others.insert(m.message_id, m.receipt_handle);
            }
        }
    }
    release(ctx, dlq_url, others.into_values()).await;
    found
}

// ---------------------------------------------------------------- redrive

/// A server-side move task (StartMessageMoveTask).
#[derive(Debug, Clone, Serialize)]
pub struct MoveTask {
    /// Handle to cancel it (running tasks only).
    pub task_handle: Option<String>,
    /// RUNNING, COMPLETED, CANCELLING, CANCELLED or FAILED.
    pub status: String,
    /// Source (DLQ) ARN.
    pub source_arn: String,
    /// Destination ARN; absent means each message's original source.
    pub destination_arn: Option<String>,
    /// Messages per second, if limited.
    pub max_per_second: Option<i32>,
    /// Messages moved so far.
    pub moved: i64,
    /// Messages to move in all, when the task started.
    pub to_move: Option<i64>,
    /// Why it failed.
    pub failure_reason: Option<String>,
    /// Start time (epoch ms).
    pub started_at: i64,
}

/// The DLQ's recent move tasks.
#[derive(Debug, Clone, Serialize)]
pub struct RedriveReport {
    /// What was done: `started`, `status` or `cancelled`.
    pub action: String,
    /// The DLQ.
    pub dlq_url: String,
    /// Task handle (start and cancel).
    pub task_handle: Option<String>,
    /// Messages moved before a cancel.
    pub moved: Option<i64>,
    /// Tasks (status).
    pub tasks: Vec<MoveTask>,
}

impl Report for RedriveReport {
    fn human(&self) -> String {
        match self.action.as_str() {
            "started" => format!(
                "started a move task on {}: {}\nfollow it with `triage dlq redrive status`\n",
                self.dlq_url,
                self.task_handle.as_deref().unwrap_or("-")
            ),
            "cancelled" => format!(
                "cancelled move task {} after {} message(s)\n",
                self.task_handle.as_deref().unwrap_or("-"),
                self.moved.unwrap_or(0)
            ),
            _ => {
                if self.tasks.is_empty() {
                    return format!("no move tasks on {}\n", self.dlq_url);
                }
                let mut t =
                    Table::new(["STATUS", "MOVED", "OF", "RATE", "DESTINATION", "HANDLE"]).max_width(100);
                for k in &self.tasks {
                    t.row([
                        k.status.clone(),
                        k.moved.to_string(),
                        k.to_move.map(|n| n.to_string()).unwrap_or_else(|| "-".into()),
                        k.max_per_second
                            .map(|n| format!("{n}/s"))
                            .unwrap_or_else(|| "max".into()),
                        k.destination_arn
                            .clone()
                            .unwrap_or_else(|| "original source".into()),
                        k.task_handle.clone().unwrap_or_else(|| "-".into()),
                    ]);
                }
                t.render()
            }
        }
    }
}

/// Move-task calls are tried once: starting a task twice after an unclear answer would
/// fail on the task the first try started, and the operator can run the command again.
fn once() -> StorageRetry {
    StorageRetry::new(StorageRetryConfig {
        max_attempts: 1,
        ..StorageRetryConfig::default()
    })
    .unwrap_or_default()
}

/// A move-task call the endpoint does not implement (moto answers HTTP 500 without an error
/// code) becomes a pointer to `dlq replay`.
fn move_task_error(ctx: &Ctx, op: &str, err: StorageError, dlq_url: &str) -> OpsError {
    let unimplemented = matches!(
        err.code(),
        None | Some("UnsupportedOperation" | "InvalidAction" | "NotImplemented")
    ) && matches!(err.status, Some(400 | 404 | 500 | 501));
    if unimplemented && ctx.custom_endpoint {
        return OpsError::new(
            ErrorKind::Unsupported,
            format!(
                "the endpoint {} does not support {op} (moto does not implement it): use `triage dlq replay`",
                ctx.sqs_endpoint
            ),
        );
    }
    ctx.sqs_storage_error(&err, Some((dlq_url, "TRIAGE_DLQ_URL")))
}

/// What `dlq redrive` is about to start, for the confirmation prompt.
#[derive(Debug, Clone, Serialize)]
pub struct RedrivePlan {
    /// The DLQ.
    pub dlq_url: String,
    /// The destination queue; absent means each message's original source.
    pub to: Option<String>,
    /// Messages in the DLQ now (SQS's approximate count), when known.
    pub approximate_messages: Option<u64>,
    /// Messages per second, if limited.
    pub rate: Option<i32>,
}

impl RedrivePlan {
    /// The confirmation question.
    pub fn question(&self) -> String {
        let count = self
            .approximate_messages
            .map_or_else(|| "every".to_owned(), |n| format!("all (about {n})"));
        let to = self.to.as_deref().map_or_else(
            || "each message's original source queue".to_owned(),
            str::to_owned,
        );
        let rate = self
            .rate
            .map(|r| format!(" at {r} message(s) per second"))
            .unwrap_or_default();
        format!(
            "move {count} message(s) from {} to {to}{rate}, with no filter and no attempt ledger reset? \
             Prefer `triage dlq replay` for a selection. [y/N] ",
            self.dlq_url
        )
    }
}

/// `dlq redrive`: starts SQS's own move task from the DLQ to each message's source (or `to`).
pub async fn redrive_start(
    ctx: &Ctx,
    dlq_url: &str,
    to: Option<&str>,
    rate: Option<i32>,
) -> OpsResult<RedriveReport> {
    redrive_start_confirmed(ctx, dlq_url, to, rate, |_| true).await
}

/// [`redrive_start`] once `confirm` approves the plan (checked after the queues are, before
/// the task starts).
pub async fn redrive_start_confirmed(
    ctx: &Ctx,
    dlq_url: &str,
    to: Option<&str>,
    rate: Option<i32>,
    confirm: impl FnOnce(&RedrivePlan) -> bool,
) -> OpsResult<RedriveReport> {
    if let Some(r) = rate {
        if !(1..=500).contains(&r) {
            return Err(OpsError::usage(
                "--rate for a move task must be 1 to 500 messages per second",
            ));
        }
    }
    let source_arn = queue_arn(ctx, dlq_url, "TRIAGE_DLQ_URL").await?;
    let (to_url, destination_arn) = match to {
        Some(q) => {
            let url = resolve_queue(ctx, q, "--to").await?;
            let arn = queue_arn(ctx, &url, "--to").await?;
            (Some(url), Some(arn))
        }
        None => (None, None),
    };
    let plan = RedrivePlan {
        dlq_url: dlq_url.to_owned(),
        to: to_url,
        approximate_messages: approximate_count(ctx, dlq_url).await,
        rate,
    };
    if !confirm(&plan) {
        return Err(OpsError::usage("redrive cancelled: no move task was started"));
    }
    let out = once()
        .call("StartMessageMoveTask", None, || {
            ctx.sqs
                .start_message_move_task()
                .source_arn(&source_arn)
                .set_destination_arn(destination_arn.clone())
                .set_max_number_of_messages_per_second(rate)
                .send()
        })
        .await
        .map_err(|e| move_task_error(ctx, "StartMessageMoveTask", e, dlq_url))?;
    Ok(RedriveReport {
        action: "started".into(),
        dlq_url: dlq_url.to_owned(),
        task_handle: out.task_handle,
        moved: None,
        tasks: Vec::new(),
    })
}

/// `dlq redrive status`: the DLQ's recent move tasks.
pub async fn redrive_status(ctx: &Ctx, dlq_url: &str) -> OpsResult<RedriveReport> {
    let source_arn = queue_arn(ctx, dlq_url, "TRIAGE_DLQ_URL").await?;
    let out = once()
        .call("ListMessageMoveTasks", None, || {
            ctx.sqs
                .list_message_move_tasks()
                .source_arn(&source_arn)
                .max_results(10)
                .send()
        })
        .await
        .map_err(|e| move_task_error(ctx, "ListMessageMoveTasks", e, dlq_url))?;
    let tasks = out
        .results
        .unwrap_or_default()
        .into_iter()
        .map(|t| MoveTask {
            task_handle: t.task_handle,
            status: t.status.unwrap_or_default(),
            source_arn: t.source_arn.unwrap_or_default(),
            destination_arn: t.destination_arn,
            max_per_second: t.max_number_of_messages_per_second,
            moved: t.approximate_number_of_messages_moved,
            to_move: t.approximate_number_of_messages_to_move,
            failure_reason: t.failure_reason,
            started_at: t.started_timestamp,
        })
        .collect();
    Ok(RedriveReport {
        action: "status".into(),
        dlq_url: dlq_url.to_owned(),
        task_handle: None,
        moved: None,
        tasks,
    })
}

/// `dlq redrive cancel [HANDLE]`: cancels the given task, or the DLQ's running one.
pub async fn redrive_cancel(ctx: &Ctx, dlq_url: &str, handle: Option<&str>) -> OpsResult<RedriveReport> {
    let handle = match handle {
        Some(h) => h.to_owned(),
        None => redrive_status(ctx, dlq_url)
            .await?
            .tasks
            .into_iter()
            .find(|t| t.status == "RUNNING")
            .and_then(|t| t.task_handle)
            .ok_or_else(|| {
                OpsError::new(ErrorKind::NotFound, format!("no running move task on {dlq_url}"))
            })?,
    };
    let out = once()
        .call("CancelMessageMoveTask", None, || {
            ctx.sqs.cancel_message_move_task().task_handle(&handle).send()
        })
        .await
        .map_err(|e| move_task_error(ctx, "CancelMessageMoveTask", e, dlq_url))?;
    Ok(RedriveReport {
        action: "cancelled".into(),
        dlq_url: dlq_url.to_owned(),
        task_handle: Some(handle),
        moved: Some(out.approximate_number_of_messages_moved),
        tasks: Vec::new(),
    })
}
