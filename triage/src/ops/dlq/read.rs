//! Reading the DLQ: one message as read, the filter that selects messages, the sweep that
//! receives a queue once, and the batched releases and deletes every verb ends with.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;
use std::time::Duration;

use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName};

use super::super::{Ctx, OpsError, OpsResult};
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use sqs_triage::core::envelope::{
    self, EnvelopeLimits, EventBridgeTypes, JOB_ID_ATTRIBUTE, JOB_TYPE_ATTRIBUTE,
};
use sqs_triage::core::failure::FailureRecord;
use sqs_triage::effects::aws_errors::OVER_LIMIT;
use sqs_triage::effects::dlq::{failure_record, original_attributes};

/// Class shown for DLQ messages without a failure record: SQS moved them itself after
/// `maxReceiveCount` receives (a consumer that crashed or timed out on them, a Lambda record
/// that could not be read, or a last-receive copy the DLQ refused), or the processor's copy
/// had no room for a record beside a body at the size limit (its error is then in the job's
/// ledger: `triage attempts show`).
pub const UNRECORDED: &str = "unrecorded";
/// Receives in a row that bring back only messages already seen and held again since the
/// last new one (or that could not be held again) before a sweep stops, cut short.
const STALE_ROUNDS: u32 = 3;

/// The job a DLQ message's body names, read as the processor reads it (the body with the
/// `job-type` / `job-id` attributes among the original ones).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyJob {
    /// The job type.
    pub job_type: String,
    /// The producer's job id, if it gave one.
    pub id: Option<String>,
}

/// One DLQ message as read. Its job type, job id and body job are worked out once, when it
/// is read.
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
    /// The message group: a FIFO group on FIFO DLQs, or a fair queue's tenant (a standard
    /// queue's `MessageGroupId`), kept on the DLQ copy and restored on replay.
    pub group_id: Option<String>,
    /// The queue SQS moved the message from (its `DeadLetterQueueSourceArn` system
    /// attribute), set when SQS's own redrive dead-lettered it after `maxReceiveCount`.
    pub source_arn: Option<String>,
    /// The job type: from the record, else the `job-type` attribute, else the envelope
    /// (`-` when none says).
    pub job_type: String,
    /// The job id: from the record, else the envelope, else the DLQ message id.
    pub job_id: String,
    /// The job as the processor reads it. This, not the failure record (a producer can forge
    /// one), says which job a replay sends back.
    pub body_job: Option<BodyJob>,
}

/// The EventBridge detail-type mapping the consumers read (`TRIAGE_EVENTBRIDGE_TYPES`), so
/// a DLQ message is read as the processor read it. Mappings a consumer sets in code are not
/// known here: give the CLI the same mapping through the variable. A bad value reads as no
/// mapping; the CLI refuses it at start ([`check_eventbridge_types`]).
pub(crate) fn eventbridge_types() -> &'static EventBridgeTypes {
    static TYPES: OnceLock<EventBridgeTypes> = OnceLock::new();
    TYPES.get_or_init(|| check_eventbridge_types().ok().flatten().unwrap_or_default())
}

/// `TRIAGE_EVENTBRIDGE_TYPES`, parsed: `None` when unset, a usage error naming the variable
/// when it cannot be read.
pub fn check_eventbridge_types() -> OpsResult<Option<EventBridgeTypes>> {
    let Some(spec) = std::env::var("TRIAGE_EVENTBRIDGE_TYPES")
        .ok()
        .filter(|s| !s.trim().is_empty())
    else {
        return Ok(None);
    };
    EventBridgeTypes::parse(&spec).map(Some).map_err(|e| {
        OpsError::usage(format!(
            "TRIAGE_EVENTBRIDGE_TYPES={spec:?} is not valid: expected `Detail Type=job.type` pairs separated by `;`, or a JSON object ({e})"
        ))
    })
}

/// The job `body` is, read as the processor reads it: the envelope, or the body with the
/// `job-type` / `job-id` attributes among the original ones (`attributes` as they are in the
/// DLQ). Why it is no job, when it is not.
pub(crate) fn body_job(
    body: &str,
    attributes: &HashMap<String, MessageAttributeValue>,
) -> Result<BodyJob, String> {
    let attrs = original_attributes(attributes).map_err(|e| e.to_string())?;
    let attr = |name: &str| attrs.get(name).and_then(|v| v.string_value());
    envelope::parse_with(
        body,
        attr(JOB_TYPE_ATTRIBUTE),
        attr(JOB_ID_ATTRIBUTE),
        EnvelopeLimits::default(),
        eventbridge_types(),
    )
    .map(|j| BodyJob {
        job_type: j.job_type,
        id: j.id,
    })
    .map_err(|e| e.to_string())
}

impl DlqMessage {
    /// This message with another body (an operator's edit), its job read from that body as
    /// the processor will read it. Refused, with why, when the body is no job: neither an
    /// envelope nor a body named by the message's `job-type` attribute.
    pub(crate) fn with_body(&self, body: String) -> Result<Self, String> {
        let job = body_job(&body, &self.attributes)?;
        Ok(Self {
            job_type: job.job_type.clone(),
            job_id: job.id.clone().unwrap_or_else(|| self.job_id.clone()),
            body_job: Some(job),
            body,
            ..self.clone()
        })
    }

    fn from_sdk(m: aws_sdk_sqs::types::Message) -> Option<Self> {
        let attributes = m.message_attributes.unwrap_or_default();
        let system = m.attributes.unwrap_or_default();
        let record = failure_record(&attributes).and_then(Result::ok);
        let message_id = m.message_id?;
        let body = m.body.unwrap_or_default();
        // The envelope alone, without attributes, read at most once and only when the record
        // and the attributes do not say.
        let plain = std::cell::OnceCell::new();
        let plain = || {
            plain.get_or_init(|| {
                envelope::parse_with(&body, None, None, EnvelopeLimits::default(), eventbridge_types()).ok()
            })
        };
        let job_type = match record.as_ref().and_then(|r| r.job_type.clone()) {
            Some(t) => t,
            None => match attributes.get(JOB_TYPE_ATTRIBUTE).and_then(|v| v.string_value()) {
                Some(t) => t.to_owned(),
                None => plain()
                    .as_ref()
                    .map_or_else(|| "-".into(), |j| j.job_type.clone()),
            },
        };
        let job_id = match &record {
            Some(r) => r.job_id.clone(),
            None => plain()
                .as_ref()
                .and_then(|j| j.id.clone())
                .unwrap_or_else(|| message_id.clone()),
        };
        let body_job = body_job(&body, &attributes).ok();
        Some(Self {
            message_id,
            receipt_handle: m.receipt_handle?,
            body,
            record,
            sent_at_ms: system
                .get(&MessageSystemAttributeName::SentTimestamp)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            group_id: system.get(&MessageSystemAttributeName::MessageGroupId).cloned(),
            source_arn: system
                .get(&MessageSystemAttributeName::DeadLetterQueueSourceArn)
                .filter(|a| !a.is_empty())
                .cloned(),
            attributes,
            job_type,
            job_id,
            body_job,
        })
    }

    /// The failure class (`fatal`, `exhausted`, `invalid`, or `unrecorded`).
    pub fn class(&self) -> &'static str {
        self.record.as_ref().map_or(UNRECORDED, |r| r.class.as_str())
    }

    /// The queue the message came from: the failure record's source queue, else the queue
    /// SQS names as the one it dead-lettered the message from.
    pub fn source_queue(&self) -> Option<&str> {
        self.record
            .as_ref()
            .map(|r| r.source_queue.as_str())
            .or(self.source_arn.as_deref())
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
    pub(crate) fn failed_at_ms(&self) -> u64 {
        self.record.as_ref().map_or(self.sent_at_ms, |r| r.failed_at)
    }

    /// The job id to show for what a replay does with this message: the body's, else
    /// [`job_id`](Self::job_id).
    pub(crate) fn body_job_id(&self) -> &str {
        self.body_job
            .as_ref()
            .and_then(|j| j.id.as_deref())
            .unwrap_or(&self.job_id)
    }

    /// Why the failure record does not describe this message's body, if it does not: the
    /// processor writes the job type and id it read from the body (the original message id
    /// for a job without an id), so a record naming another job was not written by it.
    pub fn record_mismatch(&self) -> Option<String> {
        let r = self.record.as_ref()?;
        let (body_type, body_id) = match &self.body_job {
            Some(j) => (
                Some(j.job_type.clone()),
                j.id.clone().unwrap_or_else(|| r.original_message_id.clone()),
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
            if !["fatal", "exhausted", "invalid", "expiring", "parked", UNRECORDED].contains(&c.as_str()) {
                return Err(OpsError::usage(format!(
                    "unknown failure class `{c}`: use fatal, exhausted, invalid, expiring, parked or {UNRECORDED}"
                )));
            }
        }
        Ok(())
    }

    /// True when the message matches every given criterion.
    pub fn matches(&self, m: &DlqMessage, now_ms: u64) -> bool {
        let age = Duration::from_millis(now_ms.saturating_sub(m.failed_at_ms()));
        (self.job_types.is_empty() || self.job_types.contains(&m.job_type))
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
                        || *id == m.job_id
                        || m.record.as_ref().is_some_and(|r| r.original_message_id == *id)
                }))
    }
}

/// How a read of the DLQ ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadEnd {
    /// An empty receive: every message visible in the DLQ was read.
    Complete,
    /// `--max-scan` messages were read: messages past them, if any, were not.
    ScanLimit,
    /// Messages kept coming back faster than the read could hold them again, or the queue is at
    /// SQS's in-flight limit (it hands out nothing more): messages that were in the DLQ may not
    /// have been read.
    CutShort,
}

impl ReadEnd {
    /// One line on what a read that ended this way after `read` messages leaves out, when it
    /// may leave something out.
    pub fn note(self, read: usize) -> Option<String> {
        match self {
            Self::Complete => None,
            Self::ScanLimit => Some(format!(
                "the read stopped at --max-scan ({read} message(s)): messages past them, if any, were not read"
            )),
            Self::CutShort => Some(format!(
                "the DLQ was not read to the end ({read} message(s) read; messages kept coming back, \
                 or the queue is at SQS's in-flight limit): messages that were in it may not have been \
                 read; run the command again"
            )),
        }
    }
}

/// The line a report ends with when its read stopped at `--max-scan` (else nothing).
pub(super) fn scan_limit_note(reached: bool, scanned: usize) -> String {
    match reached.then(|| ReadEnd::ScanLimit.note(scanned)).flatten() {
        Some(n) => format!("note: {n}\n"),
        None => String::new(),
    }
}

/// The problem (exit 5) of a report whose read did not reach the end of the DLQ.
pub(super) fn incomplete_problem(incomplete: bool, scanned: usize) -> Option<String> {
    incomplete.then(|| ReadEnd::CutShort.note(scanned)).flatten()
}

/// Receives every message of a queue once, holding each invisible for `visibility`. A
/// message whose hold ends before the sweep does comes back: it is held again, so that it
/// does not crowd out the messages not read yet (a slow replay holds what it does not move
/// longer than one hold).
pub(super) struct Sweep<'a> {
    ctx: &'a Ctx,
    url: &'a str,
    visibility: i32,
    seen: HashSet<String>,
    /// Messages seen again, and held again, since the last receive that brought a new one.
    held_again: HashSet<String>,
    stale_rounds: u32,
    max: usize,
    done: bool,
    cut_short: bool,
}

impl<'a> Sweep<'a> {
    pub(super) fn new(ctx: &'a Ctx, url: &'a str, visibility: Duration, max: usize) -> Self {
        Self {
            ctx,
            url,
            visibility: visibility.as_secs().clamp(1, 43_200) as i32,
            seen: HashSet::new(),
            held_again: HashSet::new(),
            stale_rounds: 0,
            max,
            done: false,
            cut_short: false,
        }
    }

    /// Reads on after an empty receive (messages made visible since may be received).
    pub(super) fn resume(&mut self) {
        if !self.cut_short {
            self.done = false;
            // What comes back now was made visible on purpose: not a sign of cycling.
            self.held_again.clear();
            self.stale_rounds = 0;
        }
    }

    /// True when the sweep stopped without an empty receive (nor `max` messages read):
    /// messages kept coming back faster than it could hold them again, so messages that were
    /// in the queue may not have been read.
    pub(super) fn cut_short(&self) -> bool {
        self.cut_short
    }

    /// How the sweep ended (or would end now, if it has not).
    pub(super) fn end(&self) -> ReadEnd {
        if self.cut_short {
            ReadEnd::CutShort
        } else if !self.done && self.seen.len() >= self.max {
            ReadEnd::ScanLimit
        } else {
            ReadEnd::Complete
        }
    }

    /// The next received batch, split into messages never seen before and messages seen
    /// again (their hold expired; the new receipt handle replaces the old). `None` when the
    /// queue has nothing more to show.
    pub(super) async fn next(&mut self) -> OpsResult<Option<(Vec<DlqMessage>, Vec<DlqMessage>)>> {
        if self.done || self.seen.len() >= self.max {
            return Ok(None);
        }
        let sqs = &self.ctx.sqs;
        let out = self
            .ctx
            .sqs_call("ReceiveMessage", Some((self.url, "TRIAGE_DLQ_URL")), || {
                sqs.receive_message()
                    .queue_url(self.url)
                    // No more than `max` messages in all.
                    .max_number_of_messages(self.max.saturating_sub(self.seen.len()).clamp(1, 10) as i32)
                    // A long poll asks every SQS server, so an empty answer means the queue has
                    // no visible message left (a short poll samples and can come back empty
                    // early).
                    .wait_time_seconds(1)
                    .visibility_timeout(self.visibility)
                    // All includes DeadLetterQueueSourceArn, the source queue of a message
                    // SQS dead-lettered itself.
                    .message_system_attribute_names(MessageSystemAttributeName::All)
                    .message_attribute_names("All")
                    .send()
            })
            .await?;
        let mut messages = out.messages.unwrap_or_default();
        if messages.is_empty() {
            // A queue at SQS's in-flight limit answers long polls with nothing and short polls
            // with OverLimit: one short poll tells that from a queue read to its end.
            match self.short_poll().await {
                Ok(more) if !more.is_empty() => messages = more,
                Ok(_) => {
                    self.done = true;
                    return Ok(None);
                }
                Err(()) => {
                    tracing::warn!(
                        queue = self.url,
                        read = self.seen.len(),
                        "the queue is at SQS's in-flight limit (OverLimit): its other messages cannot be received until held ones are released"
                    );
                    self.done = true;
                    self.cut_short = true;
                    return Ok(None);
                }
            }
        }
        let (mut new, mut again) = (Vec::new(), Vec::new());
        for m in messages.into_iter().filter_map(DlqMessage::from_sdk) {
            if self.seen.insert(m.message_id.clone()) {
                new.push(m);
            } else {
                again.push(m);
            }
        }
        if !new.is_empty() {
            self.stale_rounds = 0;
            self.held_again.clear();
        }
        let entries: Vec<(usize, String, i32)> = again
            .iter()
            .enumerate()
            .map(|(k, m)| (k, m.receipt_handle.clone(), self.visibility))
            .collect();
        let not_held = if entries.is_empty() {
            0
        } else {
            self.ctx
                .sqs_effects()
                .change_visibility(self.url, entries, None)
                .await
                .failed
                .len()
        };
        // A message back a second time with nothing new read in between: holding it again
        // does not keep it out of the receives, so the sweep is not getting further.
        let cycled = again
            .iter()
            .filter(|m| !self.held_again.insert(m.message_id.clone()))
            .count();
        if new.is_empty() && (cycled > 0 || not_held > 0) {
            self.stale_rounds += 1;
            if self.stale_rounds >= STALE_ROUNDS {
                self.done = true;
                self.cut_short = true;
            }
        }
        Ok(Some((new, again)))
    }

    /// One short poll, tried once: its messages, or `Err` when SQS answers `OverLimit`. Any
    /// other failure reads as nothing more to receive, as the long poll before it said.
    async fn short_poll(&self) -> Result<Vec<aws_sdk_sqs::types::Message>, ()> {
        let answer = self
            .ctx
            .sqs
            .receive_message()
            .queue_url(self.url)
            .max_number_of_messages(self.max.saturating_sub(self.seen.len()).clamp(1, 10) as i32)
            .wait_time_seconds(0)
            .visibility_timeout(self.visibility)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await;
        match answer {
            Ok(out) => Ok(out.messages.unwrap_or_default()),
            Err(e) if ProvideErrorMetadata::code(&e) == Some(OVER_LIMIT) => Err(()),
            Err(_) => Ok(Vec::new()),
        }
    }
}

/// Makes held messages visible again (visibility 0), ten per call. Failures are counted,
/// not fatal: those messages come back on their own when their hold expires.
pub(super) async fn release(ctx: &Ctx, url: &str, handles: impl IntoIterator<Item = String>) -> usize {
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
pub(super) async fn delete(ctx: &Ctx, url: &str, handles: &[(String, String)]) -> Vec<String> {
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
    read_to_end(ctx, dlq_url, max).await.map(|(all, _)| all)
}

/// [`read_all`], and how the read ended.
pub(crate) async fn read_to_end(
    ctx: &Ctx,
    dlq_url: &str,
    max: usize,
) -> OpsResult<(Vec<DlqMessage>, ReadEnd)> {
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
    Ok((all, sweep.end()))
}

/// SQS's approximate count of visible messages in `url`, when it can be read.
pub(super) async fn approximate_count(ctx: &Ctx, url: &str) -> Option<u64> {
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

#[cfg(test)]
mod tests {
    use aws_sdk_sqs::types::Message;

    use super::*;

    fn message(body: &str, attributes: &[(&str, &str)]) -> DlqMessage {
        let mut m = Message::builder()
            .message_id("dlq-1")
            .receipt_handle("h")
            .body(body);
        for (k, v) in attributes {
            m = m.message_attributes(
                *k,
                MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(*v)
                    .build()
                    .unwrap(),
            );
        }
        DlqMessage::from_sdk(m.build()).unwrap()
    }

    #[test]
    fn job_type_and_id_are_read_once_from_the_body_or_the_attributes() {
        let m = message(r#"{"type": "email.send", "id": "j-1", "payload": {}}"#, &[]);
        assert_eq!((m.job_type.as_str(), m.job_id.as_str()), ("email.send", "j-1"));
        assert_eq!(
            m.body_job,
            Some(BodyJob {
                job_type: "email.send".into(),
                id: Some("j-1".into())
            })
        );
        assert_eq!(m.body_job_id(), "j-1");

        // A raw body named by its attributes: the type from the attribute, no id in the body,
        // so the DLQ message id stands in for it.
        let raw = message("plain text", &[(JOB_TYPE_ATTRIBUTE, "raw.kind")]);
        assert_eq!(raw.job_type, "raw.kind");
        assert_eq!(raw.job_id, "dlq-1");

        let junk = message("{not json", &[]);
        assert_eq!((junk.job_type.as_str(), junk.job_id.as_str()), ("-", "dlq-1"));
        assert_eq!(junk.body_job, None);
        assert_eq!(junk.class(), UNRECORDED);
    }

    #[test]
    fn the_source_queue_is_the_records_else_the_one_sqs_names() {
        let arn = "arn:aws:sqs:us-east-1:123456789012:jobs";
        let body = r#"{"type": "email.send", "id": "j-1", "payload": {}}"#;
        let sqs_moved = |system: Option<&str>, attributes: &[(&str, &str)]| {
            let mut m = Message::builder()
                .message_id("dlq-1")
                .receipt_handle("h")
                .body(body);
            if let Some(a) = system {
                m = m.attributes(MessageSystemAttributeName::DeadLetterQueueSourceArn, a);
            }
            for (k, v) in attributes {
                m = m.message_attributes(
                    *k,
                    MessageAttributeValue::builder()
                        .data_type("String")
                        .string_value(*v)
                        .build()
                        .unwrap(),
                );
            }
            DlqMessage::from_sdk(m.build()).unwrap()
        };

        let m = sqs_moved(Some(arn), &[]);
        assert_eq!(m.source_arn.as_deref(), Some(arn));
        assert_eq!(m.source_queue(), Some(arn));
        assert_eq!(m.class(), UNRECORDED);

        assert_eq!(sqs_moved(None, &[]).source_queue(), None);
        assert_eq!(
            sqs_moved(Some(""), &[]).source_queue(),
            None,
            "an empty attribute names nothing"
        );

        // A failure record's source queue wins over SQS's attribute.
        let record = FailureRecord {
            class: sqs_triage::core::failure::FailureClass::Fatal,
            error: "boom".into(),
            attempts: 1,
            job_type: Some("email.send".into()),
            job_id: "j-1".into(),
            source_queue: "http://sqs/123456789012/recorded".into(),
            original_message_id: "orig-1".into(),
            first_received_at: 1,
            failed_at: 2,
        };
        let json = record.to_json_within(usize::MAX).unwrap();
        let both = sqs_moved(
            Some(arn),
            &[(sqs_triage::core::failure::FAILURE_ATTRIBUTE, &json)],
        );
        assert!(both.record.is_some(), "the record is read");
        assert_eq!(both.source_queue(), Some("http://sqs/123456789012/recorded"));
        assert_eq!(both.source_arn.as_deref(), Some(arn));
    }
}
