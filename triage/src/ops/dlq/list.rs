//! `dlq list` and `dlq show`: what is in the DLQ, grouped or one message in full, without
//! removing anything.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;

use super::super::output::{self, Report, Table};
use super::super::{Ctx, ErrorKind, OpsError, OpsResult};
use super::read::{DlqMessage, Filter, ReadEnd, incomplete_problem, read_to_end, scan_limit_note};
use sqs_triage::clock::now_ms;
use sqs_triage::core::failure::FailureRecord;
use sqs_triage::effects::dlq::original_attributes;

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
    /// The queue it came from: the failure record's source queue, else (for a message SQS
    /// dead-lettered itself) the ARN SQS gives as `DeadLetterQueueSourceArn`.
    pub source_queue: Option<String>,
}

impl MessageSummary {
    fn of(m: &DlqMessage, now: u64) -> Self {
        Self {
            message_id: m.message_id.clone(),
            job_id: m.job_id.clone(),
            job_type: m.job_type.clone(),
            class: m.class().to_owned(),
            attempts: m.record.as_ref().map(|r| r.attempts),
            age_s: now.saturating_sub(m.failed_at_ms()) / 1000,
            error: m.error(),
            source_queue: m.source_queue().map(str::to_owned),
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
    /// DLQ messages read, selected or not.
    pub scanned: usize,
    /// The read stopped at `--max-scan`: messages past them, if any, are not counted.
    pub scan_limit_reached: bool,
    /// The DLQ was not read to the end (messages kept coming back): counts may be short.
    pub incomplete: bool,
}

impl Report for ListReport {
    fn human(&self) -> String {
        let note = scan_limit_note(self.scan_limit_reached, self.scanned);
        if self.total == 0 {
            return format!("DLQ {} is empty\n{note}", self.dlq_url);
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
                output::age(Duration::from_secs(g.oldest_age_s)),
                output::age(Duration::from_secs(g.newest_age_s)),
                err,
            ]);
        }
        out.push_str(&t.render());
        if let Some(messages) = &self.messages {
            out.push('\n');
            let mut t = Table::new(["JOB ID", "TYPE", "CLASS", "ATTEMPTS", "AGE", "SOURCE", "ERROR"]);
            for m in messages {
                t.row([
                    m.job_id.clone(),
                    m.job_type.clone(),
                    m.class.clone(),
                    m.attempts.map(|a| a.to_string()).unwrap_or_else(|| "-".into()),
                    output::age(Duration::from_secs(m.age_s)),
                    m.source_queue.clone().unwrap_or_else(|| "-".into()),
                    m.error.clone(),
                ]);
            }
            out.push_str(&t.render());
        }
        out + &note
    }

    fn problem(&self) -> Option<String> {
        incomplete_problem(self.incomplete, self.scanned)
    }
}

/// Groups messages by job type and class.
pub fn group(messages: &[DlqMessage], now: u64) -> Vec<Group> {
    let mut by: BTreeMap<(String, String), Vec<&DlqMessage>> = BTreeMap::new();
    for m in messages {
        by.entry((m.job_type.clone(), m.class().to_owned()))
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
    let (read, read_end) = read_to_end(ctx, dlq_url, max).await?;
    let scanned = read.len();
    let all: Vec<DlqMessage> = read.into_iter().filter(|m| filter.matches(m, now)).collect();
    Ok(ListReport {
        dlq_url: dlq_url.to_owned(),
        total: all.len(),
        groups: group(&all, now),
        messages: with_messages.then(|| all.iter().map(|m| MessageSummary::of(m, now)).collect()),
        scanned,
        scan_limit_reached: read_end == ReadEnd::ScanLimit,
        incomplete: read_end == ReadEnd::CutShort,
    })
}

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
    /// Why the original attributes cannot be read, when they cannot (the processor's packed
    /// `triage-attributes` is not what it writes): a replay refuses such a message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attributes_error: Option<String>,
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
    /// DLQ messages read.
    pub scanned: usize,
    /// The read stopped at `--max-scan`: messages past them, if any, were not looked at.
    pub scan_limit_reached: bool,
    /// The DLQ was not read to the end (messages kept coming back).
    pub incomplete: bool,
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
            t.row(["age".to_string(), output::age(Duration::from_secs(s.age_s))]);
            t.row(["error", s.error.as_str()]);
            if let Some(source) = &s.source_queue {
                t.row(["source queue", source.as_str()]);
            }
            if let Some(r) = &m.record {
                t.row(["original message", r.original_message_id.as_str()]);
            }
            for (k, v) in &m.attributes {
                t.row([format!("attribute {k}"), v.clone()]);
            }
            if let Some(e) = &m.attributes_error {
                t.row([
                    "attributes".to_string(),
                    format!("unreadable: {e} (a replay refuses this message)"),
                ]);
            }
            t.row(["body", m.body.as_str()]);
            out.push_str(&t.render());
        }
        out + &scan_limit_note(self.scan_limit_reached, self.scanned)
    }

    fn problem(&self) -> Option<String> {
        incomplete_problem(self.incomplete, self.scanned)
    }
}

/// `dlq show ID`: every DLQ message whose job id, message id or original message id is `id`.
pub async fn show(ctx: &Ctx, dlq_url: &str, id: &str, max: usize) -> OpsResult<ShowReport> {
    let now = now_ms();
    let filter = Filter {
        ids: vec![id.to_owned()],
        ..Filter::default()
    };
    let (read, read_end) = read_to_end(ctx, dlq_url, max).await?;
    let scanned = read.len();
    let messages: Vec<ShownMessage> = read
        .into_iter()
        .filter(|m| filter.matches(m, now))
        .map(|m| {
            let (attributes, attributes_error) = match original_attributes(&m.attributes) {
                Ok(a) => (a, None),
                Err(e) => (HashMap::new(), Some(e.to_string())),
            };
            let attributes = attributes
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
                attributes_error,
                dlq_sent_at: m.sent_at_ms,
            }
        })
        .collect();
    if messages.is_empty() {
        let mut e = format!("no DLQ message with job id or message id `{id}` in {dlq_url}");
        match read_end.note(scanned) {
            Some(note) => e.push_str(&format!(" ({note})")),
            None => e.push_str(": see `triage dlq list --messages`"),
        }
        return Err(OpsError::new(ErrorKind::NotFound, e));
    }
    Ok(ShowReport {
        id: id.to_owned(),
        messages,
        scanned,
        scan_limit_reached: read_end == ReadEnd::ScanLimit,
        incomplete: read_end == ReadEnd::CutShort,
    })
}
