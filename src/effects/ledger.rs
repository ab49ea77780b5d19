//! The attempt ledger: exact handler-execution counts per job, in DynamoDB.
//!
//! One item per job type and job id (`pk = job#<id>`, `sk = ledger#<type>`; a part too long
//! for DynamoDB's key limits is replaced by its SHA-256, see [`super::table`]). Two job types
//! that share an id have separate ledgers. An execution is counted with one conditional
//! `UpdateItem` keyed on the delivery (its receive count): `ADD` makes racing distinct
//! deliveries each count once, and the condition
//! `attribute_not_exists(pk) OR NOT contains(deliveries, :delivery)` makes the same delivery
//! count at most once. The processor writes an invocation's counts and deletes together,
//! one PartiQL `BatchExecuteStatement` per 25 items with a condition per statement, and falls
//! back to that `UpdateItem` for any statement refused ([`AttemptLedger::write_batch`]).
//! First deliveries need no read; redeliveries are read with one `BatchGetItem` per 100 jobs.
//! See `docs/state.md` for why each condition is safe.
//!
//! Every operation names its jobs as `(job type, job id)` pairs (anything implementing
//! [`JobRef`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::clock::Clock;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeValue, BatchStatementErrorCodeEnum, BatchStatementRequest, DeleteRequest, KeysAndAttributes,
    PutRequest, ReturnConsumedCapacity, ReturnValue, WriteRequest,
};
use tokio::time::Instant;

use super::storage_retry::{BatchStep, FailureKind, StorageError, StorageRetry};
use super::table::{
    LEDGER_SK_DIGEST_PREFIX, LEDGER_SK_PREFIX, PK, SK, TTL_ATTRIBUTE, get_consistent, ledger_key, ledger_pk,
    ledger_sk,
};
use crate::core::decision::{Ledger, StoredAttempts};

/// Most keys one `BatchGetItem` accepts.
pub(crate) const BATCH_GET_MAX: usize = 100;
/// Most requests one `BatchWriteItem` accepts.
pub(crate) const BATCH_WRITE_MAX: usize = 25;
/// Longest stored error text (bytes); longer texts are cut at a character boundary.
pub const LAST_ERROR_MAX: usize = 1024;
/// Default item lifetime: SQS's longest retention (14 days) plus a day, so an item outlives
/// every message that can still refer to it.
pub(crate) const DEFAULT_TTL: Duration = Duration::from_secs(15 * 24 * 3600);

/// A completion marker's attributes: a count that clears a marker removes them.
const MARKER_ATTRIBUTES: [&str; 2] = ["done_at", "done_until"];

/// The `expires_at` (epoch seconds) of an item written at `now_ms` to live `ttl`, at least a
/// second: saturating, so no lifetime can wrap it around to the past.
fn expires_at_s(now_ms: u64, ttl: Duration) -> u64 {
    (now_ms / 1000).saturating_add(ttl.as_secs().max(1))
}

/// One execution to count with [`AttemptLedger::write_batch`]: what
/// [`AttemptLedger::count_waiting`] takes, and whether the job's item is believed to exist.
#[derive(Debug, Clone, Copy)]
pub struct Count<'a> {
    /// The job type.
    pub job_type: &'a str,
    /// The job id.
    pub job_id: &'a str,
    /// The delivery that ran.
    pub delivery: Delivery<'a>,
    /// The earliest next attempt (a retry), or none.
    pub next_attempt_at_ms: Option<u64>,
    /// Where a retry's message can be reached while it waits.
    pub waiting: Option<Waiting<'a>>,
    /// The failure's text (empty for none).
    pub last_error: &'a str,
    /// The job's item was read and exists: chooses `UPDATE` over `INSERT`. A wrong guess
    /// costs one more write, never a wrong count.
    pub exists: bool,
    /// The delivery saw a completion marker that no longer counts (lived out, or its job
    /// type has no marker any more): the count removes it, so it never counts again. Only
    /// that marker: a fresh one written since the read stays.
    pub clear_marker: Option<SeenMarker>,
}

/// A completion marker as a read saw it, so that a later write removes that marker and not a
/// fresh one another delivery wrote since. Markers differ in their `done_until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeenMarker {
    /// Its `done_until` (epoch ms); none for a marker written before that attribute existed.
    pub done_until_ms: Option<u64>,
}

/// Which request a statement of [`AttemptLedger::write_batch`] serves.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// The count at this index.
    Count(usize),
    /// The delete at this index.
    Forget(usize),
    /// The caller's own statement at this index.
    Extra(usize),
}

/// What one statement of [`AttemptLedger::write_batch`] came to.
#[derive(Debug, Clone)]
pub enum Written {
    /// Written.
    Done,
    /// Refused for good (its condition, the item not as expected, or the call itself, e.g. a
    /// role without the PartiQL actions): written again by the single-item call.
    Refused,
    /// Not written by the time the policy stopped (deadline, budget, attempts).
    Failed(StorageError),
}

/// The answer of [`AttemptLedger::write_batch`].
#[derive(Debug)]
pub struct Batched {
    /// One result per count, in order.
    pub counts: Vec<Result<(), StorageError>>,
    /// The deletes' result.
    pub forgotten: Result<(), StorageError>,
    /// What each extra statement came to, in order.
    pub extras: Vec<Written>,
}

/// The answer of [`AttemptLedger::count`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// This delivery was counted; the job now has this many executions.
    New(u32),
    /// This delivery had already been counted (a duplicate report): nothing changed.
    AlreadyCounted,
}

/// A job as the ledger knows it: its type and its id. Implemented for pairs
/// `(job_type, job_id)` of anything string-like, and for references to them.
pub trait JobRef {
    /// The job type.
    fn job_type(&self) -> &str;
    /// The job id.
    fn job_id(&self) -> &str;
}

impl<T: AsRef<str>, S: AsRef<str>> JobRef for (T, S) {
    fn job_type(&self) -> &str {
        self.0.as_ref()
    }
    fn job_id(&self) -> &str {
        self.1.as_ref()
    }
}

impl<J: JobRef + ?Sized> JobRef for &J {
    fn job_type(&self) -> &str {
        (**self).job_type()
    }
    fn job_id(&self) -> &str {
        (**self).job_id()
    }
}

/// `(job type, job id)`: how [`AttemptLedger::read_many`] keys its answer.
pub type JobKey = (String, String);

/// A ledger item as the CLI shows it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LedgerItem {
    /// The job id.
    pub job_id: String,
    /// Handler executions counted.
    pub attempts: u32,
    /// The job must not run before this (epoch ms).
    pub next_attempt_at_ms: Option<u64>,
    /// The last failure's text (at most [`LAST_ERROR_MAX`] bytes).
    pub last_error: Option<String>,
    /// The job type.
    pub job_type: Option<String>,
    /// The receive count of the last counted delivery.
    pub last_receive_count: Option<u32>,
    /// Every counted delivery, as `<message id>#<receive count>`.
    pub deliveries: Vec<String>,
    /// Last write (epoch ms).
    pub updated_at_ms: Option<u64>,
    /// When DynamoDB's TTL may remove it (epoch s).
    pub expires_at_s: Option<u64>,
    /// Completion marker: the job succeeded at this instant (epoch ms). Job types that opt in.
    pub done_at_ms: Option<u64>,
    /// The end of the completion marker's lifetime (epoch ms): the marker counts until then
    /// only, whatever later writes do to `expires_at`. Markers written before it existed
    /// count until `expires_at`.
    pub done_until_ms: Option<u64>,
    /// Parked by an operator at this instant (epoch ms): dead-lettered at its next delivery.
    pub parked_at_ms: Option<u64>,
    /// Who parked it, as the CLI was told.
    pub parked_by: Option<String>,
    /// Why it was parked, as the CLI was told.
    pub parked_reason: Option<String>,
    /// The receipt handle of the delivery whose retry it waits for (for `triage park`).
    pub receipt_handle: Option<String>,
    /// The queue that delivery came from.
    pub queue_url: Option<String>,
}

/// What a batch needs from one job's ledger item: its attempts, and the facts that settle a
/// delivery without running it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LedgerFacts {
    /// Attempts and the earliest next attempt.
    pub stored: StoredAttempts,
    /// The completion marker, when it has not expired (epoch ms of the success).
    pub done_at_ms: Option<u64>,
    /// The item carries a completion marker that has lived out: a count written for this
    /// delivery removes it.
    pub lived_out_marker: Option<SeenMarker>,
    /// The item's completion marker, living or not.
    pub marker: Option<SeenMarker>,
    /// When an operator parked the job (epoch ms).
    pub parked_at_ms: Option<u64>,
    /// Who parked it and why, for the failure record.
    pub park_note: Option<String>,
}

impl LedgerFacts {
    /// The decision's view of a redelivery with this item: done, parked, or its attempts.
    pub fn ledger(&self) -> Ledger {
        match (self.done_at_ms, self.parked_at_ms) {
            (Some(at_ms), _) => Ledger::Done { at_ms },
            (None, Some(at_ms)) => Ledger::Parked {
                attempts: self.stored.attempts,
                at_ms,
            },
            (None, None) => Ledger::Stored(Some(self.stored)),
        }
    }
}

/// Where a message waiting for its retry can be reached: the receipt handle of the delivery
/// that scheduled the retry and its queue. Stored with the count so `triage park` can make
/// the message visible at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting<'a> {
    /// The delivery's receipt handle.
    pub receipt_handle: &'a str,
    /// The queue URL it came from.
    pub queue_url: &'a str,
}

/// The answer of [`AttemptLedger::park`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parked {
    /// Parked now, or already parked (the item as it is after the write).
    Now(LedgerItem),
    /// The job has a ledger but does not wait for a retry (no `next_attempt_at`), or is done.
    NotWaiting(LedgerItem),
    /// The job has no ledger item.
    NoLedger,
}

impl LedgerItem {
    /// The part the decision needs.
    pub fn stored(&self) -> StoredAttempts {
        StoredAttempts {
            attempts: self.attempts,
            next_attempt_at_ms: self.next_attempt_at_ms,
        }
    }

    /// Reads an item of the current layout; `None` for anything else (another kind of item,
    /// or a ledger written by an earlier version under `sk = ledger`).
    fn parse(item: &HashMap<String, AttributeValue>) -> Option<Self> {
        let sk = s(item, SK)?;
        if !(sk.starts_with(LEDGER_SK_PREFIX) || sk.starts_with(LEDGER_SK_DIGEST_PREFIX)) {
            return None;
        }
        let mut deliveries: Vec<String> = match item.get("deliveries") {
            Some(AttributeValue::Ss(v)) => v.clone(),
            _ => Vec::new(),
        };
        deliveries.sort_unstable();
        Some(Self {
            job_id: s(item, "job_id").unwrap_or_default().to_owned(),
            attempts: n(item, "attempts").unwrap_or(0) as u32,
            next_attempt_at_ms: n(item, "next_attempt_at"),
            last_error: s(item, "last_error").map(str::to_owned),
            job_type: s(item, "job_type").map(str::to_owned),
            last_receive_count: n(item, "last_receive_count").map(|v| v as u32),
            deliveries,
            updated_at_ms: n(item, "updated_at"),
            expires_at_s: n(item, TTL_ATTRIBUTE),
            done_at_ms: n(item, "done_at"),
            done_until_ms: n(item, "done_until"),
            parked_at_ms: n(item, "parked_at"),
            parked_by: s(item, "parked_by").map(str::to_owned),
            parked_reason: s(item, "parked_reason").map(str::to_owned),
            receipt_handle: s(item, "receipt_handle").map(str::to_owned),
            queue_url: s(item, "queue_url").map(str::to_owned),
        })
    }

    /// The facts a batch reads at `now_ms`. A completion marker counts until its own
    /// `done_until` (DynamoDB's TTL deletes items up to days late, and a count moves
    /// `expires_at`); one written without it, until `expires_at`.
    pub fn facts(&self, now_ms: u64) -> LedgerFacts {
        let alive = self.marker_lives(now_ms);
        let note = match (&self.parked_by, &self.parked_reason) {
            (Some(by), Some(why)) => Some(format!("by {by}: {why}")),
            (Some(by), None) => Some(format!("by {by}")),
            (None, Some(why)) => Some(why.clone()),
            (None, None) => None,
        };
        LedgerFacts {
            stored: self.stored(),
            done_at_ms: self.done_at_ms.filter(|_| alive),
            lived_out_marker: self.seen_marker().filter(|_| !alive),
            marker: self.seen_marker(),
            parked_at_ms: self.parked_at_ms,
            park_note: self.parked_at_ms.and(note),
        }
    }

    /// The item's completion marker, if it has one.
    pub fn seen_marker(&self) -> Option<SeenMarker> {
        self.done_at_ms.map(|_| SeenMarker {
            done_until_ms: self.done_until_ms,
        })
    }

    /// Whether the item's completion marker, if any, still counts at `now_ms`.
    pub fn marker_lives(&self, now_ms: u64) -> bool {
        match self.done_until_ms {
            Some(until) => until > now_ms,
            None => self.expires_at_s.is_none_or(|e| e.saturating_mul(1000) > now_ms),
        }
    }

    /// True when the job waits for its next retry (what `triage park` needs).
    pub fn is_waiting(&self) -> bool {
        self.next_attempt_at_ms.is_some() && self.done_at_ms.is_none()
    }
}

fn s<'a>(item: &'a HashMap<String, AttributeValue>, k: &str) -> Option<&'a str> {
    item.get(k).and_then(|v| v.as_s().ok()).map(String::as_str)
}

fn n(item: &HashMap<String, AttributeValue>, k: &str) -> Option<u64> {
    item.get(k)
        .and_then(|v| v.as_n().ok())
        .and_then(|v| v.parse().ok())
}

fn num(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// Cuts `text` to at most `max` bytes at a character boundary.
pub fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The jobs once each, in first-seen order.
fn distinct<I>(jobs: I) -> Vec<JobKey>
where
    I: IntoIterator,
    I::Item: JobRef,
{
    let mut seen = HashSet::new();
    jobs.into_iter()
        .map(|j| (j.job_type().to_owned(), j.job_id().to_owned()))
        .filter(|k| seen.insert(k.clone()))
        .collect()
}

/// The `(pk, sk)` strings of an item key, to match answers to requests.
fn key_strings(key: &HashMap<String, AttributeValue>) -> Option<(String, String)> {
    Some((s(key, PK)?.to_owned(), s(key, SK)?.to_owned()))
}

/// One delivery of a message: what makes a handler execution countable exactly once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery<'a> {
    /// The SQS message id.
    pub message_id: &'a str,
    /// Its `ApproximateReceiveCount` at this delivery.
    pub receive_count: u32,
}

/// The attempt ledger over one table.
#[derive(Debug, Clone)]
pub struct AttemptLedger {
    client: Client,
    table: String,
    retry: StorageRetry,
    ttl: Duration,
    /// What the items' times (`updated_at`, `expires_at`, markers, parks) and a read's view of
    /// a marker's lifetime are read from.
    clock: Clock,
    /// Whether a refused batched write has been logged (once per ledger and its clones).
    refusal_logged: Arc<AtomicBool>,
}

impl AttemptLedger {
    /// A ledger in `table`, every call through `retry`.
    pub fn new(client: Client, table: impl Into<String>, retry: StorageRetry) -> Self {
        Self {
            client,
            table: table.into(),
            retry,
            ttl: DEFAULT_TTL,
            clock: Clock::system(),
            refusal_logged: Arc::default(),
        }
    }

    /// Reads the time from `clock` (the system's by default): the times it writes on items,
    /// and the moment a read tells a living completion marker from one that lived out.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The clock it reads.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Reads the stored attempts of redelivered jobs, given as `(job type, job id)` pairs:
    /// one consistent `BatchGetItem` per 100 distinct jobs (chunks in parallel), unprocessed
    /// keys sent again. The answer is keyed by `(job type, job id)`; jobs without an item are
    /// absent from it (no counted attempts).
    pub async fn read_many<I>(
        &self,
        jobs: I,
        deadline: Option<Instant>,
    ) -> Result<HashMap<JobKey, StoredAttempts>, StorageError>
    where
        I: IntoIterator,
        I::Item: JobRef,
    {
        Ok(self
            .read_facts(jobs, deadline)
            .await?
            .into_iter()
            .map(|(k, f)| (k, f.stored))
            .collect())
    }

    /// Like [`read_many`](Self::read_many), with every fact the batch needs from each item:
    /// its attempts, its completion marker (unexpired) and its park. Same calls.
    pub async fn read_facts<I>(
        &self,
        jobs: I,
        deadline: Option<Instant>,
    ) -> Result<HashMap<JobKey, LedgerFacts>, StorageError>
    where
        I: IntoIterator,
        I::Item: JobRef,
    {
        let ids = distinct(jobs);
        let chunks = ids
            .chunks(BATCH_GET_MAX)
            .map(|c| self.read_chunk(c.to_vec(), deadline));
        let mut out = HashMap::with_capacity(ids.len());
        for part in futures::future::try_join_all(chunks).await? {
            out.extend(part);
        }
        Ok(out)
    }

    async fn read_chunk(
        &self,
        ids: Vec<JobKey>,
        deadline: Option<Instant>,
    ) -> Result<Vec<(JobKey, LedgerFacts)>, StorageError> {
        let now = self.clock.now_ms();
        // Answers are matched to jobs by their key, not by the stored attributes: a key may be
        // a digest, and the key is what was asked for.
        let by_key: HashMap<(String, String), JobKey> = ids
            .iter()
            .map(|(t, id)| ((ledger_pk(id), ledger_sk(t)), (t.clone(), id.clone())))
            .collect();
        let by_key = &by_key;
        let result = self
            .retry
            .batch("BatchGetItem", deadline, ids, |pending| async move {
                let mut keys = KeysAndAttributes::builder().consistent_read(true);
                for (t, id) in &pending {
                    keys = keys.keys(ledger_key(t, id));
                }
                let keys = keys.build().expect("keys are set");
                let resp = self
                    .retry
                    .call("BatchGetItem", deadline, || {
                        self.client
                            .batch_get_item()
                            .return_consumed_capacity(ReturnConsumedCapacity::Total)
                            .request_items(&self.table, keys.clone())
                            .send()
                    })
                    .await
                    .map_err(|e| e.with_resource(&self.table))?;
                let mut step = BatchStep::default();
                if let Some(items) = resp.responses().and_then(|r| r.get(&self.table)) {
                    for item in items {
                        let job = key_strings(item).and_then(|k| by_key.get(&k));
                        if let (Some(job), Some(parsed)) = (job, LedgerItem::parse(item)) {
                            step.succeeded.push((job.clone(), parsed.facts(now)));
                        }
                    }
                }
                if let Some(un) = resp.unprocessed_keys().and_then(|u| u.get(&self.table)) {
                    for key in un.keys() {
                        if let Some(job) = key_strings(key).and_then(|k| by_key.get(&k)) {
                            step.retry.push(job.clone());
                        }
                    }
                }
                Ok(step)
            })
            .await;
        match result.error {
            Some(e) => Err(e),
            None => Ok(result.succeeded),
        }
    }

    /// Counts one handler execution of job `job_id` of type `job_type`, at delivery
    /// `receive_count` (its `ApproximateReceiveCount`). The same delivery is counted at most
    /// once; distinct deliveries are each counted once, in any order. Also stores the job
    /// type and id in full, the earliest next attempt and the last error (cut to
    /// [`LAST_ERROR_MAX`] bytes).
    pub async fn count(
        &self,
        job_type: &str,
        job_id: &str,
        delivery: Delivery<'_>,
        next_attempt_at_ms: Option<u64>,
        last_error: &str,
        deadline: Option<Instant>,
    ) -> Result<Counted, StorageError> {
        self.count_waiting(
            job_type,
            job_id,
            delivery,
            next_attempt_at_ms,
            None,
            last_error,
            None,
            deadline,
        )
        .await
    }

    /// [`count`](Self::count), storing as well, for a retry, where its message can be reached
    /// while it waits (`waiting`: the delivery's receipt handle and queue), in the same write.
    /// A count without `next_attempt_at_ms` removes them. `clear_marker` removes a completion
    /// marker the delivery saw no longer counting (see [`Count::clear_marker`]).
    #[allow(clippy::too_many_arguments)]
    pub async fn count_waiting(
        &self,
        job_type: &str,
        job_id: &str,
        delivery: Delivery<'_>,
        next_attempt_at_ms: Option<u64>,
        waiting: Option<Waiting<'_>>,
        last_error: &str,
        clear_marker: Option<SeenMarker>,
        deadline: Option<Instant>,
    ) -> Result<Counted, StorageError> {
        let count = |clear| {
            self.update_count(
                job_type,
                job_id,
                delivery,
                next_attempt_at_ms,
                waiting,
                last_error,
                clear,
                deadline,
            )
        };
        match count(clear_marker).await? {
            // Refused with a marker to clear: the delivery was counted, or the marker is no
            // longer the one seen (a duplicate's success wrote a fresh one). Count it alone.
            Counted::AlreadyCounted if clear_marker.is_some() => count(None).await,
            counted => Ok(counted),
        }
    }

    /// One conditional `UpdateItem` of [`count_waiting`](Self::count_waiting): refused when the
    /// delivery was counted, or, with `clear_marker`, when the item's marker is not that one.
    #[allow(clippy::too_many_arguments)]
    async fn update_count(
        &self,
        job_type: &str,
        job_id: &str,
        delivery: Delivery<'_>,
        next_attempt_at_ms: Option<u64>,
        waiting: Option<Waiting<'_>>,
        last_error: &str,
        clear_marker: Option<SeenMarker>,
        deadline: Option<Instant>,
    ) -> Result<Counted, StorageError> {
        let waiting = waiting.filter(|_| next_attempt_at_ms.is_some());
        let now = self.clock.now_ms();
        let receive_count = delivery.receive_count;
        // Keyed by message as well as receive count: a producer's re-send of the same job id
        // is a new message whose deliveries count too.
        let delivery = format!("{}#{}", delivery.message_id, delivery.receive_count);
        let mut set = "SET last_receive_count = :rc, job_type = :jt, job_id = :jid, \
                       last_error = :err, updated_at = :now, expires_at = :exp"
            .to_owned();
        if next_attempt_at_ms.is_some() {
            set.push_str(", next_attempt_at = :next");
        }
        if waiting.is_some() {
            set.push_str(", receipt_handle = :rh, queue_url = :q");
        }
        let mut expr = format!("ADD attempts :one, deliveries :dset {set}");
        let mut removed: Vec<&str> = match (next_attempt_at_ms, waiting) {
            (None, _) => vec!["next_attempt_at", "receipt_handle", "queue_url"],
            (Some(_), None) => vec!["receipt_handle", "queue_url"],
            (Some(_), Some(_)) => Vec::new(),
        };
        let mut condition = "(attribute_not_exists(pk) OR NOT contains(deliveries, :d))".to_owned();
        if let Some(seen) = clear_marker {
            removed.extend(MARKER_ATTRIBUTES);
            condition.push_str(match seen.done_until_ms {
                Some(_) => " AND (attribute_not_exists(done_at) OR done_until = :seen)",
                None => " AND (attribute_not_exists(done_at) OR attribute_not_exists(done_until))",
            });
        }
        if !removed.is_empty() {
            expr.push_str(&format!(" REMOVE {}", removed.join(", ")));
        }
        let resp = self
            .retry
            .call("UpdateItem", deadline, || {
                let mut req = self
                    .client
                    .update_item()
                    .return_consumed_capacity(ReturnConsumedCapacity::Total)
                    .table_name(&self.table)
                    .set_key(Some(ledger_key(job_type, job_id)))
                    .update_expression(&expr)
                    .condition_expression(&condition)
                    .expression_attribute_values(":one", num(1))
                    .expression_attribute_values(":dset", AttributeValue::Ss(vec![delivery.clone()]))
                    .expression_attribute_values(":d", AttributeValue::S(delivery.clone()))
                    .expression_attribute_values(":rc", num(u64::from(receive_count)))
                    .expression_attribute_values(":jt", AttributeValue::S(job_type.to_owned()))
                    .expression_attribute_values(":jid", AttributeValue::S(job_id.to_owned()))
                    .expression_attribute_values(
                        ":err",
                        AttributeValue::S(truncate(last_error, LAST_ERROR_MAX).to_owned()),
                    )
                    .expression_attribute_values(":now", num(now))
                    .expression_attribute_values(":exp", num(expires_at_s(now, self.ttl)))
                    .return_values(ReturnValue::UpdatedNew);
                if let Some(at) = next_attempt_at_ms {
                    req = req.expression_attribute_values(":next", num(at));
                }
                if let Some(until) = clear_marker.and_then(|m| m.done_until_ms) {
                    req = req.expression_attribute_values(":seen", num(until));
                }
                if let Some(w) = waiting {
                    req = req
                        .expression_attribute_values(":rh", AttributeValue::S(w.receipt_handle.to_owned()))
                        .expression_attribute_values(":q", AttributeValue::S(w.queue_url.to_owned()));
                }
                req.send()
            })
            .await;
        match resp {
            Ok(out) => {
                let attempts = out.attributes().and_then(|a| n(a, "attempts")).unwrap_or(1) as u32;
                Ok(Counted::New(attempts))
            }
            Err(e) if e.is_conditional_check_failed() => Ok(Counted::AlreadyCounted),
            Err(e) => Err(e.with_resource(&self.table)),
        }
    }

    /// Counts an invocation's executions and deletes its finished ledgers in one
    /// `BatchExecuteStatement` per 25 items (chunks in parallel), each statement under its
    /// own condition: an execution of a job whose item is believed absent is an `INSERT`
    /// (refused when the item exists), one whose item was read is an `UPDATE ... WHERE NOT
    /// contains(deliveries, ?)` (refused when the item is gone or the delivery was counted).
    /// A refused statement, and a second execution of the same job in the call (one
    /// statement per item), is written again by [`count_waiting`](Self::count_waiting), whose
    /// condition says whether it counts: the result is the same as one `UpdateItem` per
    /// execution, and a retried call whose first try landed counts nothing twice. A call
    /// refused outright (a role without the PartiQL actions) falls back the same way, deletes
    /// to [`forget`](Self::forget). A job both counted and in `forget` keeps its item, with
    /// every execution counted: at worst it dead-letters early, never late (a delete racing
    /// the count could lose them). Throttled and unanswered statements are sent again.
    /// Returns one result per count, in order, and the deletes' result.
    ///
    /// `extra` statements (another item's conditional write, e.g. a breaker report) ride in
    /// the same calls, each on an item none of the others names; what each came to is
    /// returned in order, and a refused one is the caller's to write otherwise.
    pub async fn write_batch(
        &self,
        counts: &[Count<'_>],
        forget: &[JobKey],
        extra: &[BatchStatementRequest],
        deadline: Option<Instant>,
    ) -> Batched {
        let (mut batched, extras) = self
            .write_batch_then(counts, forget, extra, deadline, std::future::ready)
            .await;
        batched.extras = extras;
        batched
    }

    /// [`write_batch`](Self::write_batch), handing what the extra statements came to to
    /// `then` as soon as the batched calls have answered, to run beside the single-item
    /// rewrites (the returned [`Batched`] has no `extras`).
    pub async fn write_batch_then<F, Fut>(
        &self,
        counts: &[Count<'_>],
        forget: &[JobKey],
        extra: &[BatchStatementRequest],
        deadline: Option<Instant>,
        then: F,
    ) -> (Batched, Fut::Output)
    where
        F: FnOnce(Vec<Written>) -> Fut,
        Fut: std::future::Future,
    {
        let (statements, mut again) = self.batch_statements(counts, forget, extra);
        let chunks = statements
            .chunks(BATCH_WRITE_MAX)
            .map(|c| self.execute_chunk(c.to_vec(), deadline));
        let mut results: Vec<Option<Result<(), StorageError>>> = vec![None; counts.len()];
        let mut forgotten = Ok(());
        let mut forget_again: Vec<&JobKey> = Vec::new();
        let no_answer = || {
            StorageError::new(
                "BatchExecuteStatement",
                None,
                "no answer for the statement",
                FailureKind::Transient,
            )
        };
        let mut extras: Vec<Written> = vec![Written::Failed(no_answer()); extra.len()];
        for outcomes in futures::future::join_all(chunks).await {
            for (target, outcome) in outcomes {
                match (target, outcome) {
                    (Target::Count(i), Written::Done) => results[i] = Some(Ok(())),
                    (Target::Count(i), Written::Refused) => again.push(i),
                    (Target::Count(i), Written::Failed(e)) => results[i] = Some(Err(e)),
                    (Target::Forget(_), Written::Done) => {}
                    (Target::Forget(k), Written::Refused) => forget_again.push(&forget[k]),
                    (Target::Forget(_), Written::Failed(e)) => forgotten = forgotten.and(Err(e)),
                    (Target::Extra(k), outcome) => extras[k] = outcome,
                }
            }
        }
        let deletes = async {
            if forget_again.is_empty() {
                return Ok(());
            }
            self.forget(forget_again, deadline).await
        };
        let rewrites = futures::future::join_all(again.iter().map(|&i| {
            let c = &counts[i];
            self.count_waiting(
                c.job_type,
                c.job_id,
                c.delivery,
                c.next_attempt_at_ms,
                c.waiting,
                c.last_error,
                c.clear_marker,
                deadline,
            )
        }));
        let (rewrites, deleted, after) = tokio::join!(rewrites, deletes, then(extras));
        forgotten = forgotten.and(deleted);
        for (&i, r) in again.iter().zip(rewrites) {
            results[i] = Some(r.map(|_| ()));
        }
        let counts = results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(no_answer())))
            .collect();
        let batched = Batched {
            counts,
            forgotten,
            extras: Vec::new(),
        };
        (batched, after)
    }

    /// The batched statements of a [`write_batch`](Self::write_batch): one per job (a count,
    /// else a delete), then the extra ones. Returns them with the indexes of the counts
    /// whose job already has a statement: those are rewritten on their own.
    fn batch_statements(
        &self,
        counts: &[Count<'_>],
        forget: &[JobKey],
        extra: &[BatchStatementRequest],
    ) -> (Vec<(Target, BatchStatementRequest)>, Vec<usize>) {
        let now = self.clock.now_ms();
        let exp = expires_at_s(now, self.ttl);
        let mut keys: HashSet<(String, String)> = HashSet::with_capacity(counts.len() + forget.len());
        let mut statements: Vec<(Target, BatchStatementRequest)> = Vec::new();
        let mut again: Vec<usize> = Vec::new();
        for (i, c) in counts.iter().enumerate() {
            if keys.insert((ledger_pk(c.job_id), ledger_sk(c.job_type))) {
                statements.push((Target::Count(i), self.count_statement(c, now, exp)));
            } else {
                again.push(i);
            }
        }
        for (k, (t, id)) in forget.iter().enumerate() {
            if keys.insert((ledger_pk(id), ledger_sk(t))) {
                let delete = BatchStatementRequest::builder()
                    .statement(format!(
                        "DELETE FROM \"{}\" WHERE \"{PK}\" = ? AND \"{SK}\" = ?",
                        self.table
                    ))
                    .parameters(AttributeValue::S(ledger_pk(id)))
                    .parameters(AttributeValue::S(ledger_sk(t)))
                    .build()
                    .expect("statement is set");
                statements.push((Target::Forget(k), delete));
            }
        }
        for (k, statement) in extra.iter().enumerate() {
            statements.push((Target::Extra(k), statement.clone()));
        }
        (statements, again)
    }

    /// The statement that counts `c`: `INSERT` of a new item, or a conditional `UPDATE` of
    /// the item that was read. Both write what [`count_waiting`](Self::count_waiting) writes.
    fn count_statement(&self, c: &Count<'_>, now: u64, exp: u64) -> BatchStatementRequest {
        let waiting = c.waiting.filter(|_| c.next_attempt_at_ms.is_some());
        let delivery = format!("{}#{}", c.delivery.message_id, c.delivery.receive_count);
        let mut fields: Vec<(&str, AttributeValue)> = vec![
            ("last_receive_count", num(u64::from(c.delivery.receive_count))),
            ("job_type", AttributeValue::S(c.job_type.to_owned())),
            ("job_id", AttributeValue::S(c.job_id.to_owned())),
            (
                "last_error",
                AttributeValue::S(truncate(c.last_error, LAST_ERROR_MAX).to_owned()),
            ),
            ("updated_at", num(now)),
            (TTL_ATTRIBUTE, num(exp)),
        ];
        if let Some(at) = c.next_attempt_at_ms {
            fields.push(("next_attempt_at", num(at)));
        }
        if let Some(w) = waiting {
            fields.push(("receipt_handle", AttributeValue::S(w.receipt_handle.to_owned())));
            fields.push(("queue_url", AttributeValue::S(w.queue_url.to_owned())));
        }
        let table = &self.table;
        let b = BatchStatementRequest::builder();
        let b = if c.exists {
            let mut sql = format!(
                "UPDATE \"{table}\" SET \"attempts\" = \"attempts\" + ? SET \"deliveries\" = set_add(\"deliveries\", ?)"
            );
            let mut params = vec![num(1), AttributeValue::Ss(vec![delivery.clone()])];
            for (name, v) in fields {
                sql.push_str(&format!(" SET \"{name}\" = ?"));
                params.push(v);
            }
            let mut removed: Vec<&str> = match (c.next_attempt_at_ms, waiting) {
                (None, _) => vec!["next_attempt_at", "receipt_handle", "queue_url"],
                (Some(_), None) => vec!["receipt_handle", "queue_url"],
                (Some(_), Some(_)) => Vec::new(),
            };
            if c.clear_marker.is_some() {
                removed.extend(MARKER_ATTRIBUTES);
            }
            for name in removed {
                sql.push_str(&format!(" REMOVE \"{name}\""));
            }
            sql.push_str(&format!(
                " WHERE \"{PK}\" = ? AND \"{SK}\" = ? AND NOT contains(\"deliveries\", ?)"
            ));
            params.push(AttributeValue::S(ledger_pk(c.job_id)));
            params.push(AttributeValue::S(ledger_sk(c.job_type)));
            params.push(AttributeValue::S(delivery));
            // Only the marker seen: a fresh one refuses the statement, and the single-item
            // write counts the delivery without clearing it.
            match c.clear_marker.map(|m| m.done_until_ms) {
                Some(Some(until)) => {
                    sql.push_str(" AND (\"done_at\" IS MISSING OR \"done_until\" = ?)");
                    params.push(num(until));
                }
                Some(None) => sql.push_str(" AND (\"done_at\" IS MISSING OR \"done_until\" IS MISSING)"),
                None => {}
            }
            b.statement(sql).set_parameters(Some(params))
        } else {
            let mut sql = format!(
                "INSERT INTO \"{table}\" VALUE {{'{PK}': ?, '{SK}': ?, 'attempts': ?, 'deliveries': ?"
            );
            let mut params = vec![
                AttributeValue::S(ledger_pk(c.job_id)),
                AttributeValue::S(ledger_sk(c.job_type)),
                num(1),
                AttributeValue::Ss(vec![delivery]),
            ];
            for (name, v) in fields {
                sql.push_str(&format!(", '{name}': ?"));
                params.push(v);
            }
            sql.push('}');
            b.statement(sql).set_parameters(Some(params))
        };
        b.build().expect("statement is set")
    }

    /// One `BatchExecuteStatement` of at most 25 statements, retried by the storage policy:
    /// throttled and failed statements are sent again. What each statement came to.
    async fn execute_chunk(
        &self,
        statements: Vec<(Target, BatchStatementRequest)>,
        deadline: Option<Instant>,
    ) -> Vec<(Target, Written)> {
        let result = self
            .retry
            .batch(
                "BatchExecuteStatement",
                deadline,
                statements,
                |pending| async move {
                    let requests: Vec<BatchStatementRequest> =
                        pending.iter().map(|(_, r)| r.clone()).collect();
                    let resp = self
                        .retry
                        .call("BatchExecuteStatement", deadline, || {
                            self.client
                                .batch_execute_statement()
                                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                                .set_statements(Some(requests.clone()))
                                .send()
                        })
                        .await
                        .map_err(|e| e.with_resource(&self.table))?;
                    let mut step = BatchStep::default();
                    let answers = resp.responses();
                    for (k, (target, request)) in pending.into_iter().enumerate() {
                        // Answers come in the order of the statements.
                        let Some(answer) = answers.get(k) else {
                            step.retry.push((target, request));
                            continue;
                        };
                        let Some(err) = answer.error() else {
                            step.succeeded.push((target, Written::Done));
                            continue;
                        };
                        match err.code() {
                            Some(
                                BatchStatementErrorCodeEnum::ConditionalCheckFailed
                                | BatchStatementErrorCodeEnum::DuplicateItem
                                | BatchStatementErrorCodeEnum::ValidationError,
                            ) => step.succeeded.push((target, Written::Refused)),
                            Some(
                                BatchStatementErrorCodeEnum::ThrottlingError
                                | BatchStatementErrorCodeEnum::ProvisionedThroughputExceeded
                                | BatchStatementErrorCodeEnum::RequestLimitExceeded
                                | BatchStatementErrorCodeEnum::TransactionConflict
                                | BatchStatementErrorCodeEnum::InternalServerError,
                            ) => step.retry.push((target, request)),
                            // Refused for another reason (access, a missing table, an item
                            // collection full): the single-item write says whether it is so.
                            _ => step.succeeded.push((target, Written::Refused)),
                        }
                    }
                    Ok(step)
                },
            )
            .await;
        let mut outcomes = result.succeeded;
        // A call refused outright (a role without the PartiQL actions, a request DynamoDB
        // rejects) falls back to the single-item writes; one that ran out of time, budget or
        // attempts does not: there is no time left for them.
        let refused = result
            .error
            .as_ref()
            .is_some_and(|e| e.kind == FailureKind::Permanent);
        if let Some(e) = result.error.as_ref().filter(|_| refused) {
            if !self.refusal_logged.swap(true, Ordering::Relaxed) {
                tracing::warn!(error = %e, "batched ledger write refused: counts and deletes fall back to one call per item (a role without dynamodb:PartiQLInsert, PartiQLUpdate and PartiQLDelete on the table refuses it); logged once");
            }
        }
        for ((target, _), why) in result.failed {
            let outcome = match &result.error {
                _ if refused => Written::Refused,
                Some(e) => Written::Failed(e.clone()),
                None => Written::Failed(
                    StorageError::new("BatchExecuteStatement", None, why, FailureKind::Transient)
                        .with_resource(&self.table),
                ),
            };
            outcomes.push((target, outcome));
        }
        outcomes
    }

    /// Deletes the ledgers of jobs that are done with them, given as `(job type, job id)`
    /// pairs: a redelivered job that succeeded, a dead-lettered job, a job an operator replays
    /// (so it starts again from attempt 1). `BatchWriteItem` with at most 25 deletes per call,
    /// chunks in parallel, unprocessed items sent again. Deleting a missing item is not an
    /// error. The one way to delete a ledger.
    pub async fn forget<I>(&self, jobs: I, deadline: Option<Instant>) -> Result<(), StorageError>
    where
        I: IntoIterator,
        I::Item: JobRef,
    {
        self.forget_and_mark_done(jobs, Vec::new(), deadline).await
    }

    /// Finishes jobs in one batched write: deletes the ledgers of `forget` (as
    /// [`forget`](Self::forget)) and replaces the items of `done` — each with its marker's
    /// lifetime — with a completion marker (`done_at`). Both kinds share `BatchWriteItem`
    /// calls, at most 25 requests each, chunks in parallel, unprocessed items sent again. The
    /// puts are unconditional: every writer of a marker writes the same fact (see
    /// `docs/state.md`). A job in both lists is marked, not deleted.
    pub async fn forget_and_mark_done<I>(
        &self,
        forget: I,
        done: Vec<(JobKey, Duration)>,
        deadline: Option<Instant>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator,
        I::Item: JobRef,
    {
        let mut writes: Vec<(JobKey, Option<Duration>)> = Vec::new();
        let mut seen: HashSet<JobKey> = HashSet::new();
        for (k, ttl) in done {
            if seen.insert(k.clone()) {
                writes.push((k, Some(ttl)));
            }
        }
        for k in distinct(forget) {
            if seen.insert(k.clone()) {
                writes.push((k, None));
            }
        }
        let now = self.clock.now_ms();
        let chunks = writes
            .chunks(BATCH_WRITE_MAX)
            .map(|c| self.write_chunk(c.to_vec(), now, deadline));
        futures::future::try_join_all(chunks).await?;
        Ok(())
    }

    /// One `BatchWriteItem` of deletes (`None`) and completion markers (`Some(lifetime)`).
    async fn write_chunk(
        &self,
        ids: Vec<(JobKey, Option<Duration>)>,
        now: u64,
        deadline: Option<Instant>,
    ) -> Result<(), StorageError> {
        let by_key: HashMap<(String, String), (JobKey, Option<Duration>)> = ids
            .iter()
            .map(|((t, id), mark)| ((ledger_pk(id), ledger_sk(t)), ((t.clone(), id.clone()), *mark)))
            .collect();
        let by_key = &by_key;
        let result: super::storage_retry::BatchResult<(JobKey, Option<Duration>), ()> = self
            .retry
            .batch("BatchWriteItem", deadline, ids, |pending| async move {
                let requests: Vec<WriteRequest> = pending
                    .iter()
                    .map(|((t, id), mark)| {
                        if let Some(ttl) = mark {
                            let mut item = ledger_key(t, id);
                            item.insert("job_id".into(), AttributeValue::S(id.clone()));
                            item.insert("job_type".into(), AttributeValue::S(t.clone()));
                            item.insert("done_at".into(), num(now));
                            item.insert(
                                "done_until".into(),
                                num(now.saturating_add(ttl.as_millis().min(u64::MAX as u128) as u64)),
                            );
                            item.insert("updated_at".into(), num(now));
                            item.insert(TTL_ATTRIBUTE.into(), num(expires_at_s(now, *ttl)));
                            let put = PutRequest::builder()
                                .set_item(Some(item))
                                .build()
                                .expect("item is set");
                            return WriteRequest::builder().put_request(put).build();
                        }
                        let del = DeleteRequest::builder()
                            .set_key(Some(ledger_key(t, id)))
                            .build()
                            .expect("key is set");
                        WriteRequest::builder().delete_request(del).build()
                    })
                    .collect();
                let resp = self
                    .retry
                    .call("BatchWriteItem", deadline, || {
                        self.client
                            .batch_write_item()
                            .return_consumed_capacity(ReturnConsumedCapacity::Total)
                            .request_items(&self.table, requests.clone())
                            .send()
                    })
                    .await
                    .map_err(|e| e.with_resource(&self.table))?;
                let mut step = BatchStep::default();
                if let Some(un) = resp.unprocessed_items().and_then(|u| u.get(&self.table)) {
                    for w in un {
                        let key = w
                            .delete_request()
                            .and_then(|d| key_strings(d.key()))
                            .or_else(|| w.put_request().and_then(|p| key_strings(p.item())));
                        if let Some(job) = key.and_then(|k| by_key.get(&k)) {
                            step.retry.push(job.clone());
                        }
                    }
                }
                Ok(step)
            })
            .await;
        match result.error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Parks a job that waits for its next retry: sets `parked_at` (kept when already set),
    /// `parked_by` and `parked_reason` with one conditional `UpdateItem` (the item must exist
    /// and have a `next_attempt_at`, and no completion marker). The processor dead-letters a
    /// parked job at its next delivery. When the condition fails, one consistent read says
    /// whether the job has a ledger at all.
    pub async fn park(
        &self,
        job_type: &str,
        job_id: &str,
        by: Option<&str>,
        reason: Option<&str>,
    ) -> Result<Parked, StorageError> {
        let now = self.clock.now_ms();
        let mut set = "SET parked_at = if_not_exists(parked_at, :now), updated_at = :now".to_owned();
        if by.is_some() {
            set.push_str(", parked_by = :by");
        }
        if reason.is_some() {
            set.push_str(", parked_reason = :why");
        }
        let resp = self
            .retry
            .call("UpdateItem", None, || {
                let mut req = self
                    .client
                    .update_item()
                    .return_consumed_capacity(ReturnConsumedCapacity::Total)
                    .table_name(&self.table)
                    .set_key(Some(ledger_key(job_type, job_id)))
                    .update_expression(&set)
                    .condition_expression(
                        "attribute_exists(pk) AND attribute_exists(next_attempt_at) AND attribute_not_exists(done_at)",
                    )
                    .expression_attribute_values(":now", num(now))
                    .return_values(ReturnValue::AllNew);
                if let Some(by) = by {
                    req = req.expression_attribute_values(":by", AttributeValue::S(truncate(by, 256).to_owned()));
                }
                if let Some(why) = reason {
                    req = req.expression_attribute_values(
                        ":why",
                        AttributeValue::S(truncate(why, LAST_ERROR_MAX).to_owned()),
                    );
                }
                req.send()
            })
            .await;
        let fill = |mut i: LedgerItem| {
            i.job_id = job_id.to_owned();
            i.job_type.get_or_insert_with(|| job_type.to_owned());
            i
        };
        match resp {
            Ok(out) => Ok(match out.attributes().and_then(LedgerItem::parse) {
                Some(i) => Parked::Now(fill(i)),
                None => Parked::NoLedger,
            }),
            Err(e) if e.is_conditional_check_failed() => match self.show(job_type, job_id).await? {
                Some(i) => Ok(Parked::NotWaiting(i)),
                None => Ok(Parked::NoLedger),
            },
            Err(e) => Err(e.with_resource(&self.table)),
        }
    }

    /// Reads one job's ledger (consistent read), for the CLI.
    pub async fn show(&self, job_type: &str, job_id: &str) -> Result<Option<LedgerItem>, StorageError> {
        let item = get_consistent(
            &self.client,
            &self.retry,
            &self.table,
            ledger_key(job_type, job_id),
            None,
        )
        .await?;
        Ok(item.as_ref().and_then(LedgerItem::parse).map(|mut i| {
            // The key is what was asked for: fill in what the item may lack.
            i.job_id = job_id.to_owned();
            i.job_type.get_or_insert_with(|| job_type.to_owned());
            i
        }))
    }

    /// Reads the ledgers of job id `job_id` under every job type (one consistent `Query` of
    /// its partition, pages followed), for the CLI when no type is given. Items of an
    /// earlier version's layout are left out.
    pub async fn show_all_types(&self, job_id: &str) -> Result<Vec<LedgerItem>, StorageError> {
        let pk = ledger_pk(job_id);
        let mut out = Vec::new();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let page = self
                .retry
                .call("Query", None, || {
                    self.client
                        .query()
                        .return_consumed_capacity(ReturnConsumedCapacity::Total)
                        .table_name(&self.table)
                        .key_condition_expression("pk = :pk AND begins_with(sk, :ledger)")
                        .expression_attribute_values(":pk", AttributeValue::S(pk.clone()))
                        .expression_attribute_values(":ledger", AttributeValue::S("ledger".into()))
                        .consistent_read(true)
                        .set_exclusive_start_key(start.clone())
                        .send()
                })
                .await
                .map_err(|e| e.with_resource(&self.table))?;
            out.extend(page.items().iter().filter_map(LedgerItem::parse).map(|mut i| {
                i.job_id = job_id.to_owned();
                i
            }));
            match page.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => break,
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expiry_saturates_instead_of_overflowing() {
        assert_eq!(expires_at_s(10_500, Duration::from_secs(60)), 70);
        assert_eq!(expires_at_s(10_500, Duration::ZERO), 11, "at least a second");
        assert_eq!(expires_at_s(u64::MAX, Duration::MAX), u64::MAX);
        assert_eq!(expires_at_s(1_000, Duration::from_secs(u64::MAX)), u64::MAX);
    }

    #[test]
    fn truncates_at_char_boundaries() {
        assert_eq!(truncate("abc", 5), "abc");
        assert_eq!(truncate("abcdef", 3), "abc");
        assert_eq!(truncate("aé", 2), "a");
        let long = "x".repeat(5000);
        assert_eq!(truncate(&long, LAST_ERROR_MAX).len(), LAST_ERROR_MAX);
    }

    #[test]
    fn parses_items() {
        let item = HashMap::from([
            (PK.to_owned(), AttributeValue::S("job#j1".into())),
            (SK.to_owned(), AttributeValue::S("ledger#t".into())),
            ("job_id".to_owned(), AttributeValue::S("j1".into())),
            ("job_type".to_owned(), AttributeValue::S("t".into())),
            ("attempts".to_owned(), num(3)),
            ("next_attempt_at".to_owned(), num(99)),
            (
                "deliveries".to_owned(),
                AttributeValue::Ss(vec!["m#3".into(), "m#1".into()]),
            ),
        ]);
        let parsed = LedgerItem::parse(&item).unwrap();
        assert_eq!(parsed.job_id, "j1");
        assert_eq!(parsed.job_type.as_deref(), Some("t"));
        assert_eq!(parsed.deliveries, vec!["m#1", "m#3"]);
        assert_eq!(
            parsed.stored(),
            StoredAttempts {
                attempts: 3,
                next_attempt_at_ms: Some(99)
            }
        );
    }

    #[test]
    fn earlier_layout_is_not_read() {
        let old = HashMap::from([
            (PK.to_owned(), AttributeValue::S("job#j1".into())),
            (SK.to_owned(), AttributeValue::S("ledger".into())),
            ("attempts".to_owned(), num(3)),
        ]);
        assert_eq!(LedgerItem::parse(&old), None);
    }

    #[test]
    fn pairs_and_references_name_jobs() {
        let owned: Vec<JobKey> = vec![("t".into(), "a".into()), ("t".into(), "a".into())];
        assert_eq!(distinct(&owned), vec![("t".to_owned(), "a".to_owned())]);
        let borrowed = distinct([("t", "a"), ("u", "a"), ("t", "b")]);
        assert_eq!(borrowed.len(), 3, "a type and an id are both part of the job");
    }
}
