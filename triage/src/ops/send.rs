//! `triage send`: one job from flags, or many from NDJSON, in batches of up to ten entries and
//! SQS's batch payload cap (split by [`sqs_triage::effects::sqs::batches`]).

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use futures::stream::{self, StreamExt};
use indicatif::ProgressBar;
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::time::Instant;

use super::output::{Report, progress};
use super::{Ctx, ErrorKind, OpsError, OpsResult, is_fifo};
use sqs_triage::core::envelope::{self, EnvelopeLimits};
use sqs_triage::effects::sqs::{BATCH_BYTES, BATCH_LIMIT, EntryResults, Outgoing, Sqs, batches};
use sqs_triage::effects::storage_retry::StorageError;

/// Batches in flight at once.
const CONCURRENCY: usize = 8;
/// SQS's longest per-message delay.
const MAX_DELAY_S: u32 = 900;

/// One job to send: the fields of an NDJSON line, or of the `send` flags.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Job type.
    #[serde(rename = "type")]
    pub job_type: String,
    /// Handler input (any JSON; absent means null), sent as given.
    #[serde(default)]
    pub payload: Payload,
    /// Job id (on a FIFO queue it keys the deduplication of a run's lines, and must be 1-128
    /// characters of letters, digits and ASCII punctuation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Delivery delay in seconds (0-900, standard queues only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<u32>,
    /// Message group (required for FIFO queues).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// A job's payload: its JSON text as given, without the whitespace between its tokens, so it
/// is sent as written (a parse and a write would rewrite a number that a 64-bit reading
/// cannot carry, such as `123456789012345678901234` or `19.99999999999999999`), on one line.
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct Payload(Box<RawValue>);

impl Payload {
    /// The payload `text` is, when it is one JSON value the processor can read (a number in
    /// range, no lone surrogate, nesting within serde_json's limit).
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str::<Value>(text)?;
        serde_json::from_str(&compact(text)).map(Self)
    }

    /// The payload's JSON text.
    pub fn text(&self) -> &str {
        self.0.get()
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        Self::parse(raw.get()).map_err(serde::de::Error::custom)
    }
}

/// `json` (one JSON value) without the whitespace between its tokens; the text of its strings,
/// numbers and names as written.
fn compact(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        if in_string {
            out.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            in_string = c == '"';
            out.push(c);
        }
    }
    out
}

impl Default for Payload {
    /// `null`, the payload of a job that names none.
    fn default() -> Self {
        Self(RawValue::NULL.to_owned())
    }
}

impl PartialEq for Payload {
    /// The same text.
    fn eq(&self, other: &Self) -> bool {
        self.text() == other.text()
    }
}

impl JobSpec {
    /// The envelope body a producer would send: `id`, `payload` and `type`, in that order, the
    /// payload's text as given but for U+FFFE and U+FFFF, escaped as SQS needs
    /// ([`sqs_text::json`](sqs_triage::core::sqs_text::json)).
    pub fn body(&self) -> String {
        let string = |s: &str| Value::from(s).to_string();
        let mut body = String::with_capacity(self.payload.text().len() + self.job_type.len() + 64);
        body.push('{');
        if let Some(id) = &self.id {
            body.push_str("\"id\":");
            body.push_str(&string(id));
            body.push(',');
        }
        body.push_str("\"payload\":");
        body.push_str(self.payload.text());
        body.push_str(",\"type\":");
        body.push_str(&string(&self.job_type));
        body.push('}');
        sqs_triage::core::sqs_text::json(body)
    }

    /// Checks the job against the envelope rules and the target queue's kind.
    pub fn validate(&self, fifo: bool) -> Result<(), String> {
        envelope::parse(&self.body(), None, None, EnvelopeLimits::default()).map_err(|e| e.to_string())?;
        if let Some(d) = self.delay {
            if d > MAX_DELAY_S {
                return Err(format!("delay {d}s is over SQS's {MAX_DELAY_S}s maximum"));
            }
            if fifo && d > 0 {
                return Err("FIFO queues take no per-message delay: drop the delay".into());
            }
        }
        if fifo && self.group.as_deref().is_none_or(str::is_empty) {
            return Err("FIFO queues need a message group: pass --group (or \"group\" in NDJSON)".into());
        }
        if let Some(group) = &self.group {
            check_sqs_id(group).map_err(|e| {
                format!(
                    "group {} {e}: not a valid message group id ({SQS_ID_RULE})",
                    shown(group)
                )
            })?;
        }
        if let (true, Some(id)) = (fifo, &self.id) {
            check_sqs_id(id).map_err(|e| {
                format!(
                    "id {} {e}: on a FIFO queue the job id keys the deduplication id ({SQS_ID_RULE})",
                    shown(id)
                )
            })?;
        }
        Ok(())
    }
}

/// One line of input: its number, the job it holds, and its text as read (terminator included),
/// so the lines not sent can be written back byte for byte.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Input line (1-based; 1 for a single job from flags).
    pub line: usize,
    /// The job.
    pub spec: JobSpec,
    /// The line as read, with its `\n` or `\r\n` (a job from flags: its NDJSON form and `\n`).
    pub raw: String,
}

impl Job {
    /// A job from flags, as line 1, written back as its NDJSON form.
    pub fn from_spec(spec: JobSpec) -> Self {
        let raw = serde_json::to_string(&spec).unwrap_or_default() + "\n";
        Self { line: 1, spec, raw }
    }
}

/// Bad lines listed in one refusal, at most.
const MAX_LISTED: usize = 10;

/// One usage error for every bad line of the input: nothing is sent.
fn refuse(errors: Vec<String>) -> OpsError {
    if errors.len() == 1 {
        return OpsError::usage(errors.into_iter().next().unwrap_or_default());
    }
    let n = errors.len();
    let mut listed: Vec<String> = errors.into_iter().take(MAX_LISTED).collect();
    if n > MAX_LISTED {
        listed.push(format!("and {} more", n - MAX_LISTED));
    }
    OpsError::usage(format!("{n} bad lines, nothing sent: {}", listed.join("; ")))
}

/// Reads NDJSON jobs (blank lines skipped), keeping each line's text. Every line is checked
/// (envelope, delay, FIFO group and deduplication ids); any bad line refuses the whole input,
/// naming every bad line, so nothing is half-sent.
pub fn parse_jobs(text: &str, fifo: bool) -> OpsResult<Vec<Job>> {
    let mut jobs = Vec::new();
    let mut errors = Vec::new();
    for (i, raw) in text.split_inclusive('\n').enumerate() {
        let n = i + 1;
        let line = raw.strip_suffix('\n').unwrap_or(raw);
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() {
            continue;
        }
        let spec: JobSpec = match serde_json::from_str(line) {
            Ok(spec) => spec,
            Err(e) => {
                errors.push(format!(
                    "line {n}: not a job: {e} (expected {{\"type\": \"...\", \"payload\": ..., \"id\": \"...\"}})"
                ));
                continue;
            }
        };
        if let Err(e) = spec.validate(fifo) {
            errors.push(format!("line {n}: {e}"));
            continue;
        }
        jobs.push(Job {
            line: n,
            spec,
            raw: raw.to_owned(),
        });
    }
    if !errors.is_empty() {
        return Err(refuse(errors));
    }
    if jobs.is_empty() {
        return Err(OpsError::usage(
            "no jobs in the input: give one JSON object per line",
        ));
    }
    Ok(jobs)
}

/// Reads NDJSON jobs as [`parse_jobs`] does, without the lines' text.
#[cfg(test)]
pub(crate) fn parse_ndjson(text: &str, fifo: bool) -> OpsResult<Vec<(usize, JobSpec)>> {
    Ok(parse_jobs(text, fifo)?
        .into_iter()
        .map(|j| (j.line, j.spec))
        .collect())
}

/// A job SQS accepted.
#[derive(Debug, Clone, Serialize)]
pub struct Sent {
    /// Input line (1 for a single job from flags).
    pub line: usize,
    /// Job id, if given.
    pub id: Option<String>,
    /// SQS message id.
    pub message_id: String,
}

/// A job SQS answered as sent but did not store: a FIFO queue deduplicated it against an
/// earlier line of this run.
#[derive(Debug, Clone, Serialize)]
pub struct Duplicate {
    /// Input line.
    pub line: usize,
    /// Job id, if given (the deduplication id).
    pub id: Option<String>,
    /// The message id SQS answered with.
    pub message_id: String,
    /// The earlier line whose message SQS kept.
    pub duplicate_of: usize,
}

/// Why a job was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NotSent {
    /// SQS refused it (the entry, or the whole call with a 4xx answer, throttling included):
    /// it is not on the queue.
    Rejected,
    /// No answer says what became of it (a 5xx, a timeout, a dropped connection, an answer that
    /// left it out): it may or may not be on the queue.
    Unconfirmed,
    /// Not attempted: an earlier line of its FIFO message group was not sent, and sending this
    /// one would have put it ahead of that line.
    Skipped,
}

impl NotSent {
    fn as_str(self) -> &'static str {
        match self {
            NotSent::Rejected => "rejected",
            NotSent::Unconfirmed => "unconfirmed",
            NotSent::Skipped => "skipped",
        }
    }
}

/// A job that was not sent.
#[derive(Debug, Clone, Serialize)]
pub struct Rejected {
    /// Input line.
    pub line: usize,
    /// Job id, if given.
    pub id: Option<String>,
    /// Refused, unconfirmed or skipped.
    pub status: NotSent,
    /// SQS error code (`Unconfirmed` when there is none, `GroupStopped` for a skipped line).
    pub code: String,
    /// Why.
    pub message: String,
}

/// What `send` did.
#[derive(Debug, Clone, Serialize)]
pub struct SendReport {
    /// Target queue.
    pub queue_url: String,
    /// Jobs in the input.
    pub requested: usize,
    /// Jobs SQS accepted and stored (deduplicated ones not counted).
    pub accepted: usize,
    /// Jobs a FIFO queue deduplicated against an earlier line of this run.
    pub deduplicated: usize,
    /// Jobs not sent (rejected, unconfirmed or skipped).
    pub not_sent: usize,
    /// Accepted jobs and their message ids, in input order.
    pub sent: Vec<Sent>,
    /// Deduplicated jobs, in input order.
    pub duplicates: Vec<Duplicate>,
    /// Jobs not sent, in input order.
    pub rejected: Vec<Rejected>,
    /// Things the operator should know that are not a line's fate (e.g. a FIFO group whose
    /// order SQS broke inside one batch).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Where the lines not sent were written (`--unsent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsent_file: Option<String>,
}

/// `lines 3-7`, `line 9`, or `lines 3-9 (5 jobs)` when lines in between were blank.
fn line_span(first: usize, last: usize, count: usize) -> String {
    if count == 1 {
        format!("line {first}")
    } else if last - first + 1 == count {
        format!("lines {first}-{last}")
    } else {
        format!("lines {first}-{last} ({count} jobs)")
    }
}

/// Line numbers as short ranges of consecutive entries: `1-10, 14, 20-22`.
fn line_ranges(lines: &[usize], max: usize) -> String {
    let mut spans: Vec<(usize, usize)> = Vec::new();
    for &l in lines {
        match spans.last_mut() {
            Some((_, last)) if *last + 1 == l => *last = l,
            _ => spans.push((l, l)),
        }
    }
    let n = spans.len();
    let mut out: Vec<String> = spans
        .into_iter()
        .take(max)
        .map(|(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") })
        .collect();
    if n > max {
        out.push("…".into());
    }
    out.join(", ")
}

impl Report for SendReport {
    fn human(&self) -> String {
        let mut out = format!(
            "sent {} of {} job(s) to {}\n",
            self.accepted, self.requested, self.queue_url
        );
        if self.requested == 1 {
            if let Some(s) = self.sent.first() {
                out.push_str(&format!("message id {}\n", s.message_id));
            }
        }
        for d in &self.duplicates {
            out.push_str(&format!(
                "deduplicated line {}{}: SQS kept line {}'s message, not a new one\n",
                d.line,
                d.id.as_deref().map(|i| format!(" (id {i})")).unwrap_or_default(),
                d.duplicate_of
            ));
        }
        // Runs of adjacent entries with one fate print as one line.
        let mut i = 0;
        while i < self.rejected.len() {
            let r = &self.rejected[i];
            let mut j = i + 1;
            while j < self.rejected.len()
                && self.rejected[j].status == r.status
                && self.rejected[j].code == r.code
                && self.rejected[j].message == r.message
            {
                j += 1;
            }
            let span = if j - i == 1 {
                format!(
                    "line {}{}",
                    r.line,
                    r.id.as_deref()
                        .map(|id| format!(" (id {id})"))
                        .unwrap_or_default()
                )
            } else {
                line_span(r.line, self.rejected[j - 1].line, j - i)
            };
            out.push_str(&format!(
                "not sent {span}: {}: {}: {}\n",
                r.status.as_str(),
                r.code,
                r.message
            ));
            i = j;
        }
        for w in &self.warnings {
            out.push_str(&format!("warning: {w}\n"));
        }
        if let Some(f) = &self.unsent_file {
            out.push_str(&format!("{} unsent line(s) written to {f}\n", self.not_sent));
        }
        out
    }

    fn problem(&self) -> Option<String> {
        (self.not_sent > 0).then(|| {
            let lines: Vec<usize> = self.rejected.iter().map(|r| r.line).collect();
            let next = match &self.unsent_file {
                Some(f) => format!("they are in {f}: send that file again (--file {f})"),
                None => "pass --unsent FILE to get them as a file to send again".into(),
            };
            format!(
                "{} of {} job(s) were not sent (lines {}); {next}",
                self.not_sent,
                self.requested,
                line_ranges(&lines, 8)
            )
        })
    }
}

/// The lines not sent, as read, in input order: the content of the `--unsent` file.
pub fn unsent_text(jobs: &[Job], report: &SendReport) -> String {
    let lines: std::collections::HashSet<usize> = report.rejected.iter().map(|r| r.line).collect();
    jobs.iter()
        .filter(|j| lines.contains(&j.line))
        .map(|j| j.raw.as_str())
        .collect()
}

/// Every job's line, as read: the `--unsent` file when nothing could be sent.
pub fn all_text(jobs: &[Job]) -> String {
    jobs.iter().map(|j| j.raw.as_str()).collect()
}

/// Writes `text` to `path` whole or not at all (a temporary file beside it, then a rename), so
/// the unsent file may be the input file itself.
pub fn write_unsent(path: &Path, text: &str) -> OpsResult<()> {
    let fail = |e: std::io::Error| {
        OpsError::new(
            ErrorKind::Failed,
            format!("cannot write the unsent lines to {}: {e}", path.display()),
        )
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "unsent".into());
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    // The lines hold payloads: the file keeps the permissions of the one it replaces, and a
    // new one is readable by its owner only.
    let mode = std::fs::metadata(path).map_or(0o600, |m| {
        use std::os::unix::fs::PermissionsExt;
        m.permissions().mode()
    });
    let written = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
    }
    .and_then(|mut f| {
        use std::os::unix::fs::PermissionsExt;
        // The process's umask applies to `mode` on creation: set it exactly.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()
    });
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(e));
    }
    Ok(())
}

/// SQS's rule for message group and deduplication ids: 1 to 128 characters, each a letter, a
/// digit or ASCII punctuation.
pub(crate) fn check_sqs_id(value: &str) -> Result<(), String> {
    let n = value.chars().count();
    if n == 0 || n > 128 {
        return Err(format!("is {n} characters long"));
    }
    if let Some(c) = value.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(format!("contains {c:?}"));
    }
    Ok(())
}

/// A value as shown in a message: quoted, long ones cut.
fn shown(value: &str) -> String {
    if value.chars().count() > 40 {
        format!("{:?}…", value.chars().take(40).collect::<String>())
    } else {
        format!("{value:?}")
    }
}

const SQS_ID_RULE: &str = "SQS takes 1-128 characters of letters, digits and ASCII punctuation (no spaces)";

/// A line's FIFO deduplication id: a hash of the run's nonce and the job id, else a random one.
/// Not the job id itself: SQS drops a deduplication id sent again within five minutes even
/// when its first message was processed and deleted since, so a job sent again by a later run
/// would be dropped and reported sent. Lines of one run with one job id share an id (SQS keeps
/// the first, and the report says `deduplicated`); the SDK's retries of a batch resend its ids.
fn dedup_id(spec: &JobSpec, run: u128) -> String {
    use sha2::{Digest, Sha256};
    let Some(id) = &spec.id else {
        return format!("{:032x}", rand::rng().random::<u128>());
    };
    let mut h = Sha256::new();
    h.update(run.to_be_bytes());
    h.update(id.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// What became of one job.
#[derive(Debug, Clone)]
enum Fate {
    Pending,
    Sent(String),
    NotSent(NotSent, String, String),
}

/// Records one batch's answer in `fates`. An entry listed under `Successful` is sent. An entry
/// that failed with the whole call is refused when SQS answered the call with a 4xx (it
/// stored nothing), unconfirmed otherwise; one SQS named as failed is refused.
fn record(fates: &mut [Fate], r: EntryResults) {
    // A call that got a 4xx at the end but had a try without a definite answer before (a
    // timeout, a reset, a 5xx) may have stored the batch: unconfirmed, not refused.
    let whole = r
        .error
        .as_ref()
        .map(|e| (e.to_string(), e.status.filter(|_| !e.uncertain)));
    for k in r.accepted {
        fates[k] = Fate::Sent(r.message_ids.get(&k).cloned().unwrap_or_default());
    }
    for (k, why) in r.failed {
        let code = r.codes.get(&k).cloned();
        let status = match &whole {
            Some((text, status)) if *text == why => match status {
                Some(s) if (400..500).contains(s) => NotSent::Rejected,
                _ => NotSent::Unconfirmed,
            },
            _ if code.is_some() => NotSent::Rejected,
            _ => NotSent::Unconfirmed,
        };
        fates[k] = Fate::NotSent(status, code.unwrap_or_else(|| "Unconfirmed".into()), why);
    }
}

/// SQS's FIFO deduplication interval.
const DEDUP_WINDOW: Duration = Duration::from_secs(300);

/// One line SQS answered as sent, for [`duplicates`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Answered<'a> {
    key: usize,
    dedup_id: Option<&'a str>,
    message_id: &'a str,
    /// When its batch call started and ended, from the start of the run.
    started: Duration,
    ended: Duration,
}

/// The lines, among those SQS answered as sent, that a FIFO queue deduplicated against an
/// earlier line of this run: a repeated message id (SQS answers a deduplicated send with the
/// first message's id), or a repeated deduplication id surely within SQS's five minutes (the
/// later call ended less than five minutes after the earlier one started). `sent` is in send
/// order; returns `(key, key of the earlier line)`.
pub(crate) fn duplicates(sent: &[Answered<'_>]) -> Vec<(usize, usize)> {
    let mut by_dedup: HashMap<&str, (usize, Duration)> = HashMap::new();
    let mut by_message: HashMap<&str, usize> = HashMap::new();
    let mut out = Vec::new();
    for a in sent {
        let by_id = a
            .dedup_id
            .and_then(|d| by_dedup.get(d))
            .filter(|(_, started)| a.ended.saturating_sub(*started) < DEDUP_WINDOW)
            .map(|(k, _)| *k);
        let by_message_id = (!a.message_id.is_empty())
            .then(|| by_message.get(a.message_id).copied())
            .flatten();
        match by_message_id.or(by_id) {
            Some(first) => out.push((a.key, first)),
            None => {
                if let Some(d) = a.dedup_id {
                    by_dedup.insert(d, (a.key, a.started));
                }
                if !a.message_id.is_empty() {
                    by_message.insert(a.message_id, a.key);
                }
            }
        }
    }
    out
}

/// Sends the jobs to `queue_url`, as [`send_jobs`] does.
pub async fn send(
    ctx: &Ctx,
    queue_url: &str,
    jobs: Vec<(usize, JobSpec)>,
    show_progress: bool,
) -> OpsResult<SendReport> {
    let jobs: Vec<Job> = jobs
        .into_iter()
        .map(|(line, spec)| Job {
            line,
            ..Job::from_spec(spec)
        })
        .collect();
    send_jobs(ctx, queue_url, &jobs, show_progress).await
}

/// Sends the jobs to `queue_url` and says what became of each line. A job counts as sent only
/// when SQS lists it as successful.
///
/// To a standard queue, several batches are in flight at once. To a FIFO queue, batches go one
/// after another in input order, and once a line of a message group is not sent, the later
/// lines of that group are not sent either (reported `skipped`), so a group never reaches the
/// queue out of order; lines SQS deduplicates are reported as duplicates, not as sent.
pub async fn send_jobs(
    ctx: &Ctx,
    queue_url: &str,
    jobs: &[Job],
    show_progress: bool,
) -> OpsResult<SendReport> {
    let fifo = is_fifo(queue_url);
    let outgoing = outgoing_jobs(jobs, fifo)?;
    let dedup_ids: Vec<Option<String>> = outgoing.iter().map(|m| m.dedup_id.clone()).collect();
    let mut run = SendRun::new(
        ctx,
        queue_url,
        jobs,
        progress(show_progress, jobs.len() as u64, "sending"),
    );
    if fifo {
        run.send_in_order(&outgoing).await;
    } else {
        run.send_concurrently(outgoing).await;
    }
    run.bar.finish_and_clear();
    let any_sent = run.fates.iter().any(|f| matches!(f, Fate::Sent(_)));
    // Nothing reached SQS because of the queue or the endpoint: one clear line, not a list.
    if let (false, Some(e)) = (any_sent, &run.error) {
        let line = ctx.sqs_storage_error(e, Some((queue_url, "TRIAGE_QUEUE_URL")));
        if line.kind != ErrorKind::Failed {
            return Err(line);
        }
    }
    let dups: HashMap<usize, usize> = if fifo {
        duplicates(&run.answered(&dedup_ids)).into_iter().collect()
    } else {
        HashMap::new()
    };
    Ok(run.into_report(&dups))
}

/// The messages for `jobs`, keyed by their index; every job is checked first, and any job
/// that is not valid for the queue refuses the whole send.
fn outgoing_jobs(jobs: &[Job], fifo: bool) -> OpsResult<Vec<Outgoing>> {
    let errors: Vec<String> = jobs
        .iter()
        .filter_map(|j| {
            j.spec
                .validate(fifo)
                .err()
                .map(|e| format!("line {}: {e}", j.line))
        })
        .collect();
    if !errors.is_empty() {
        return Err(refuse(errors));
    }
    let run_nonce: u128 = rand::rng().random();
    Ok(jobs
        .iter()
        .enumerate()
        .map(|(key, job)| Outgoing {
            key,
            body: job.spec.body(),
            attributes: HashMap::new(),
            group_id: job.spec.group.clone(),
            dedup_id: fifo.then(|| dedup_id(&job.spec, run_nonce)),
            delay_seconds: if fifo {
                None
            } else {
                job.spec.delay.map(|d| d as i32)
            },
        })
        .collect())
}

/// One send's progress: each line's fate and when its batch call ran.
struct SendRun<'a> {
    queue_url: &'a str,
    jobs: &'a [Job],
    sqs: Sqs,
    bar: ProgressBar,
    fates: Vec<Fate>,
    /// When each line's batch call started and ended, from the start of the run.
    times: Vec<(Duration, Duration)>,
    run: Instant,
    error: Option<StorageError>,
    warnings: Vec<String>,
}

impl<'a> SendRun<'a> {
    fn new(ctx: &Ctx, queue_url: &'a str, jobs: &'a [Job], bar: ProgressBar) -> Self {
        Self {
            queue_url,
            jobs,
            sqs: ctx.sqs_effects(),
            bar,
            fates: vec![Fate::Pending; jobs.len()],
            run: Instant::now(),
            times: vec![(Duration::ZERO, Duration::ZERO); jobs.len()],
            error: None,
            warnings: Vec::new(),
        }
    }

    /// To a FIFO queue: one batch at a time, in order; a group with a line not sent sends
    /// nothing more.
    async fn send_in_order(&mut self, outgoing: &[Outgoing]) {
        let mut stopped: HashMap<String, usize> = HashMap::new();
        let mut next = 0;
        while next < outgoing.len() {
            let batch = self.next_in_order(outgoing, &mut next, &stopped);
            if batch.is_empty() {
                continue;
            }
            let keys: Vec<usize> = batch.iter().map(|m| m.key).collect();
            let started = self.run.elapsed();
            let r = self.sqs.send(self.queue_url, batch, None).await;
            let ended = self.run.elapsed();
            for &k in &keys {
                self.times[k] = (started, ended);
            }
            self.bar.inc(keys.len() as u64);
            self.error = self.error.take().or_else(|| r.error.clone());
            record(&mut self.fates, r);
            self.stop_groups(outgoing, &keys, &mut stopped);
        }
    }

    /// The next FIFO batch from `outgoing[*next..]`, within SQS's batch limits; a line of a
    /// stopped group is skipped (reported so).
    fn next_in_order(
        &mut self,
        outgoing: &[Outgoing],
        next: &mut usize,
        stopped: &HashMap<String, usize>,
    ) -> Vec<Outgoing> {
        let mut batch = Vec::new();
        let mut bytes = 0;
        while *next < outgoing.len() && batch.len() < BATCH_LIMIT {
            let m = &outgoing[*next];
            let group = m.group_id.clone().unwrap_or_default();
            if let Some(&first) = stopped.get(&group) {
                self.fates[*next] = Fate::NotSent(
                    NotSent::Skipped,
                    "GroupStopped".into(),
                    format!(
                        "not attempted: line {first} of message group {} was not sent, and this line must not overtake it",
                        shown(&group)
                    ),
                );
                self.bar.inc(1);
                *next += 1;
                continue;
            }
            let n = m.payload_bytes();
            if !batch.is_empty() && bytes + n > BATCH_BYTES {
                break;
            }
            bytes += n;
            batch.push(m.clone());
            *next += 1;
        }
        batch
    }

    /// Stops each group with a line of the batch `keys` not sent; says so if SQS took a later
    /// line of the group from the same batch (its order on the queue is then broken there).
    fn stop_groups(&mut self, outgoing: &[Outgoing], keys: &[usize], stopped: &mut HashMap<String, usize>) {
        let jobs = self.jobs;
        let mut failed_in_batch: HashMap<String, usize> = HashMap::new();
        for &k in keys {
            let group = outgoing[k].group_id.clone().unwrap_or_default();
            match &self.fates[k] {
                Fate::Sent(_) => {
                    if let Some(&first) = failed_in_batch.get(&group) {
                        self.warnings.push(format!(
                            "line {} of message group {} was accepted in the same batch as line {}, which was not: on the queue it is ahead of that line",
                            jobs[k].line,
                            shown(&group),
                            jobs[first].line
                        ));
                    }
                }
                _ => {
                    failed_in_batch.entry(group.clone()).or_insert(k);
                    stopped.entry(group).or_insert(jobs[k].line);
                }
            }
        }
    }

    /// To a standard queue: several batches in flight at once.
    async fn send_concurrently(&mut self, outgoing: Vec<Outgoing>) {
        let queue_url = self.queue_url;
        let results = stream::iter(batches(outgoing, BATCH_LIMIT))
            .map(|batch| {
                let (bar, sqs) = (self.bar.clone(), &self.sqs);
                async move {
                    let n = batch.len() as u64;
                    let r = sqs.send(queue_url, batch, None).await;
                    bar.inc(n);
                    r
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        for r in results {
            self.error = self.error.take().or_else(|| r.error.clone());
            record(&mut self.fates, r);
        }
    }

    /// The lines SQS answered as sent, in send order, for [`duplicates`].
    fn answered<'s>(&'s self, dedup_ids: &'s [Option<String>]) -> Vec<Answered<'s>> {
        self.fates
            .iter()
            .enumerate()
            .filter_map(|(k, f)| match f {
                Fate::Sent(m) => Some(Answered {
                    key: k,
                    dedup_id: dedup_ids[k].as_deref(),
                    message_id: m.as_str(),
                    started: self.times[k].0,
                    ended: self.times[k].1,
                }),
                _ => None,
            })
            .collect()
    }

    /// What became of each line; `dups` maps a deduplicated line's key to the earlier one's.
    fn into_report(self, dups: &HashMap<usize, usize>) -> SendReport {
        let jobs = self.jobs;
        let (mut sent, mut duplicates_out, mut rejected) = (Vec::new(), Vec::new(), Vec::new());
        for (k, fate) in self.fates.into_iter().enumerate() {
            let job = &jobs[k];
            match fate {
                Fate::Sent(message_id) => match dups.get(&k) {
                    Some(&first) => duplicates_out.push(Duplicate {
                        line: job.line,
                        id: job.spec.id.clone(),
                        message_id,
                        duplicate_of: jobs[first].line,
                    }),
                    None => sent.push(Sent {
                        line: job.line,
                        id: job.spec.id.clone(),
                        message_id,
                    }),
                },
                Fate::NotSent(status, code, message) => rejected.push(Rejected {
                    line: job.line,
                    id: job.spec.id.clone(),
                    status,
                    code,
                    message,
                }),
                Fate::Pending => rejected.push(Rejected {
                    line: job.line,
                    id: job.spec.id.clone(),
                    status: NotSent::Unconfirmed,
                    code: "Unconfirmed".into(),
                    message: "no answer named this job".into(),
                }),
            }
        }
        SendReport {
            queue_url: self.queue_url.to_owned(),
            requested: jobs.len(),
            accepted: sent.len(),
            deduplicated: duplicates_out.len(),
            not_sent: rejected.len(),
            sent,
            duplicates: duplicates_out,
            rejected,
            warnings: self.warnings,
            unsent_file: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ndjson_lines_become_jobs() {
        let jobs = parse_ndjson(
            "{\"type\":\"a\",\"payload\":{\"x\":1},\"id\":\"j1\"}\n\n{\"type\":\"b\"}\n",
            false,
        )
        .unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0].0, 1);
        assert_eq!(jobs[1].0, 3);
        assert_eq!(jobs[1].1.payload.text(), "null");
        assert_eq!(jobs[0].1.body(), r#"{"id":"j1","payload":{"x":1},"type":"a"}"#);
    }

    #[test]
    fn payloads_are_sent_as_given() {
        let payload = r#"{"n":123456789012345678901234,"p":19.99999999999999999,"e":1e2,"s":"\u00e9"}"#;
        let jobs = parse_ndjson(&format!("{{\"type\":\"a\",\"payload\": {payload} }}\n"), false).unwrap();
        assert_eq!(jobs[0].1.body(), format!(r#"{{"payload":{payload},"type":"a"}}"#));
        let flags = JobSpec {
            job_type: "a\"b".into(),
            payload: Payload::parse(&format!(" {payload}\n")).unwrap(),
            id: Some("j\n1".into()),
            delay: None,
            group: None,
        };
        assert_eq!(
            flags.body(),
            format!(r#"{{"id":"j\n1","payload":{payload},"type":"a\"b"}}"#)
        );
        assert!(Payload::parse("{not json").is_err());
        assert!(Payload::parse("1 2").is_err());
    }

    #[test]
    fn payloads_lose_only_the_whitespace_between_tokens() {
        let given = "{\n  \"a b\" : [ 1 ,\t2e0 ],\r\n  \"s\": \"x \\\" \\\\ y\\n\" }\n";
        let p = Payload::parse(given).unwrap();
        assert_eq!(p.text(), r#"{"a b":[1,2e0],"s":"x \" \\ y\n"}"#);
        // The same value, read as the processor reads it.
        assert_eq!(
            serde_json::from_str::<Value>(p.text()).unwrap(),
            serde_json::from_str::<Value>(given).unwrap()
        );
        let line = format!("{{\"type\":\"t\",\"payload\":{given}}}");
        let jobs = parse_ndjson(&line.replace(['\n', '\r'], " "), false).unwrap();
        assert_eq!(jobs[0].1.payload, p);
        // Written back as one NDJSON line.
        let job = Job::from_spec(JobSpec {
            payload: p,
            ..jobs[0].1.clone()
        });
        assert_eq!(job.raw.matches('\n').count(), 1);
        assert_eq!(parse_ndjson(&job.raw, false).unwrap()[0].1, job.spec);
    }

    #[test]
    fn payloads_the_processor_cannot_read_are_refused_as_json() {
        for bad in [
            "1e400",
            "\"\\ud800\"",
            &format!("{}1{}", "[".repeat(200), "]".repeat(200)),
        ] {
            assert!(Payload::parse(bad).is_err(), "{bad}");
            let line = format!("{{\"type\":\"t\",\"payload\":{bad}}}");
            let e = parse_ndjson(&line, false).unwrap_err();
            assert!(e.message.contains("line 1: not a job"), "{}", e.message);
        }
    }

    #[test]
    fn lines_keep_their_text_and_every_bad_line_is_named() {
        let text = "{\"type\":\"a\"}\r\n\n {\"type\":\"b\"}\n{\"type\":\"c\"}";
        let jobs = parse_jobs(text, false).unwrap();
        let raw: Vec<&str> = jobs.iter().map(|j| j.raw.as_str()).collect();
        assert_eq!(
            raw,
            ["{\"type\":\"a\"}\r\n", " {\"type\":\"b\"}\n", "{\"type\":\"c\"}"]
        );
        assert_eq!(jobs.iter().map(|j| j.line).collect::<Vec<_>>(), [1, 3, 4]);
        assert_eq!(all_text(&jobs), text.replace("\n\n", "\n"));

        let e = parse_jobs(
            "{\"type\":\"a\",\"group\":\"g\"}\n{bad\n{\"type\":\"a\",\"group\":\"a b\"}\n{\"type\":\"a\",\"group\":\"g\",\"id\":\"é\"}\n",
            true,
        )
        .unwrap_err();
        assert!(
            e.message
                .starts_with("3 bad lines, nothing sent: line 2: not a job"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("line 3: group \"a b\" contains ' '"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("line 4: id \"é\" contains 'é'"),
            "{}",
            e.message
        );
    }

    #[test]
    fn sqs_ids_are_one_to_128_printable_ascii_characters() {
        assert!(check_sqs_id("a-Z_0.9!\"#$%&'()*+,/:;<=>?@[\\]^`{|}~").is_ok());
        assert!(check_sqs_id(&"x".repeat(128)).is_ok());
        assert!(check_sqs_id(&"x".repeat(129)).is_err());
        assert!(check_sqs_id("").is_err());
        for bad in ["a b", "tab\t", "é", "new\nline"] {
            assert!(check_sqs_id(bad).is_err(), "{bad:?}");
        }
        // On a standard queue the id is no deduplication id: any envelope id goes.
        let spec = JobSpec {
            job_type: "t".into(),
            payload: Payload::default(),
            id: Some("with space".into()),
            delay: None,
            group: None,
        };
        assert!(spec.validate(false).is_ok());
        let fifo = JobSpec {
            group: Some("g".into()),
            ..spec
        };
        assert!(fifo.validate(true).unwrap_err().contains("deduplication id"));
    }

    #[test]
    fn repeated_dedup_or_message_ids_are_duplicates_of_the_first() {
        let at = |key, dedup_id, message_id, minute: u64| Answered {
            key,
            dedup_id: Some(dedup_id),
            message_id,
            started: Duration::from_secs(minute * 60),
            ended: Duration::from_secs(minute * 60 + 1),
        };
        let sent = [
            at(0, "a", "m0", 0),
            at(1, "b", "m1", 0),
            at(2, "a", "m2", 1),
            // AWS answers a deduplicated send with the first message's id.
            at(3, "r-1", "m1", 2),
            at(4, "c", "", 2),
            at(5, "d", "", 2),
            // Five minutes after line 0's call started, "a" is a new message again.
            at(6, "a", "m6", 5),
        ];
        assert_eq!(duplicates(&sent), vec![(2, 0), (3, 1)]);
    }

    #[test]
    fn the_report_names_lines_not_sent_as_ranges() {
        assert_eq!(line_ranges(&[1, 2, 3, 5, 7, 8], 8), "1-3, 5, 7-8");
        assert_eq!(line_ranges(&[1, 3, 5], 2), "1, 3, …");
        let not_sent = |line, status| Rejected {
            line,
            id: None,
            status,
            code: "InternalFailure".into(),
            message: "m".into(),
        };
        let report = SendReport {
            queue_url: "q".into(),
            requested: 6,
            accepted: 2,
            deduplicated: 0,
            not_sent: 4,
            sent: Vec::new(),
            duplicates: Vec::new(),
            rejected: vec![
                not_sent(1, NotSent::Unconfirmed),
                not_sent(2, NotSent::Unconfirmed),
                not_sent(4, NotSent::Unconfirmed),
                not_sent(5, NotSent::Skipped),
            ],
            warnings: Vec::new(),
            unsent_file: None,
        };
        let text = report.human();
        assert!(
            text.contains("not sent lines 1-4 (3 jobs): unconfirmed: InternalFailure: m\n"),
            "{text}"
        );
        assert!(text.contains("not sent line 5: skipped"), "{text}");
        let problem = report.problem().unwrap();
        assert!(
            problem.starts_with("4 of 6 job(s) were not sent (lines 1-2, 4-5); pass --unsent FILE"),
            "{problem}"
        );
        let jobs: Vec<Job> = (1..=6)
            .map(|line| Job {
                line,
                spec: JobSpec {
                    job_type: "t".into(),
                    payload: Payload::default(),
                    id: None,
                    delay: None,
                    group: None,
                },
                raw: format!("{line}\n"),
            })
            .collect();
        assert_eq!(unsent_text(&jobs, &report), "1\n2\n4\n5\n");
    }

    #[test]
    fn bad_lines_name_their_line() {
        let e = parse_ndjson("{\"type\":\"a\"}\n{bad\n", false).unwrap_err();
        assert!(e.message.starts_with("line 2: not a job"), "{}", e.message);
        let e = parse_ndjson("{\"type\":\"\"}\n", false).unwrap_err();
        assert!(e.message.starts_with("line 1: job type"), "{}", e.message);
        let e = parse_ndjson("{\"type\":\"a\"}\n", true).unwrap_err();
        assert!(e.message.contains("--group"), "{}", e.message);
        assert!(parse_ndjson("\n", false).is_err());
    }
}
